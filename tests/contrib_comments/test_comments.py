"""urlguard.contrib.comments on a real django-contrib-comments site: a comment linking
a listed URL, posted through the comments app's own form and view, is saved held
(is_public=False) with the reason in the admin; a clean one is published as before."""

from __future__ import annotations

import django_comments
import pytest
from django.contrib.auth import get_user_model
from django.contrib.sites.models import Site
from django.urls import reverse

from urlguard.contrib.comments.models import HeldComment
from urlguard.hotpath.guard import Guard
from urlguard.models import HitEvent
from urlguard.runtime import stats
from urlguard.writepath.changes import add_rule

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("fresh_guard"),
    # django-contrib-comments 2.2.0's own form: its URLField names no assume_scheme.
    pytest.mark.filterwarnings(
        "ignore:The default scheme will be changed"
        ":django.utils.deprecation.RemovedInDjango60Warning"
    ),
]

Comment = django_comments.get_model()


@pytest.fixture
def article(build_filter):
    """Something to comment on (any model will do: the site's own user here)."""
    add_rule("pills.top/", category="spam", source="test")
    build_filter()
    return get_user_model().objects.create(username="author")


def post_comment(client, target, text, url=""):
    form = django_comments.get_form()(target)
    data = {
        **form.generate_security_data(),
        "name": "Visitor",
        "email": "visitor@example.com",
        "url": url,
        "comment": text,
        "honeypot": "",
    }
    return client.post(reverse("comments-post-comment"), data)


def test_a_comment_with_a_listed_link_is_held_with_its_reason(client, article):
    response = post_comment(client, article, "Great read! Cheap meds at www.PILLS.top/deal")
    assert response.status_code == 302  # the comments app's "posted" page
    comment = Comment.objects.get()
    assert comment.is_public is False
    hold = HeldComment.objects.get()
    assert hold.comment == comment
    assert hold.reason == ("links to http://www.PILLS.top/deal, listed as Spam (rule pills.top/)")
    stats.flush()
    assert list(HitEvent.objects.values_list("action", "host")) == [("text", "www.pills.top")]


def test_a_comment_whose_website_is_listed_is_held(client, article):
    # The form's "url" (the commenter's website) is shown as a link by most sites.
    response = post_comment(client, article, "Nice article, thanks.", url="http://pills.top/win")
    assert response.status_code == 302
    assert Comment.objects.get().is_public is False
    assert "links to http://pills.top/win" in HeldComment.objects.get().reason


def test_a_clean_comment_is_published_as_before(client, article):
    response = post_comment(client, article, "Nice. More at https://docs.python.org/3/")
    assert response.status_code == 302
    assert Comment.objects.get().is_public is True
    assert not HeldComment.objects.exists()


def test_a_comment_made_in_code_is_held_too(article):
    comment = Comment.objects.create(
        content_object=article, site=Site.objects.get_current(), comment="pills.top/x"
    )
    comment.refresh_from_db()
    assert comment.is_public is False
    assert "pills.top/x" in HeldComment.objects.get().reason
    comment.delete()
    assert not HeldComment.objects.exists()


def test_a_published_comment_edited_to_link_a_listed_url_is_held(article):
    comment = Comment.objects.create(
        content_object=article, site=Site.objects.get_current(), comment="Nice post."
    )
    assert comment.is_public is True
    comment.comment = "Nice post. Update: cheap meds at pills.top/now"
    comment.save()
    comment.refresh_from_db()
    assert comment.is_public is False
    assert "links to http://pills.top/now" in HeldComment.objects.get().reason
    # Approved as it stands, it stays published: only a change of its text is checked.
    comment.is_public = True
    comment.save()
    comment.refresh_from_db()
    assert comment.is_public is True


def test_a_comment_that_cannot_be_checked_waits_for_a_moderator(article, use_guard):
    use_guard(Guard(lambda: None, on_filter_error="closed"))
    comment = Comment.objects.create(
        content_object=article, site=Site.objects.get_current(), comment="see news.top/x"
    )
    assert comment.is_public is False
    assert "http://news.top/x could not be checked" in HeldComment.objects.get().reason


def test_a_moderator_sees_why_and_can_approve(client, article, django_user_model):
    post_comment(client, article, "Buy: pills.top/now")
    comment = Comment.objects.get()
    client.force_login(django_user_model.objects.create_superuser("boss", "b@example.com", None))
    changelist = client.get(reverse("admin:django_comments_comment_changelist"))
    assert changelist.status_code == 200
    page = changelist.content.decode()
    assert "Held by urlguard" in page
    assert "links to http://pills.top/now, listed as Spam (rule pills.top/)" in page
    change = client.get(reverse("admin:django_comments_comment_change", args=[comment.pk]))
    assert "listed as Spam" in change.content.decode()
    holds = client.get(reverse("admin:urlguard_comments_heldcomment_changelist"))
    assert "listed as Spam" in holds.content.decode()
    # Approving (the comments admin's own action) publishes it: the hold is no verdict.
    client.post(
        reverse("admin:django_comments_comment_changelist"),
        {"action": "approve_comments", "_selected_action": [comment.pk]},
    )
    comment.refresh_from_db()
    assert comment.is_public is True


def test_the_models_and_migrations_agree():
    from django.core.management import call_command

    call_command("makemigrations", "urlguard_comments", "--check", "--dry-run", verbosity=0)
