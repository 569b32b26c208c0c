"""urlguard.validators: on a form or model field, text linking to a listed URL is refused
with one ValidationError (code "listed_link") naming each listed link and its category;
clean text passes; the validator is deconstructible (a model field's migration can
write it)."""

from __future__ import annotations

import pytest
from django import forms
from django.core.exceptions import ValidationError
from django.db import models
from django.db.migrations.writer import MigrationWriter

from urlguard.hotpath.guard import Guard
from urlguard.validators import NoListedLinksValidator, validate_no_listed_links
from urlguard.writepath.changes import add_rule

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_guard")]


@pytest.fixture
def listed(build_filter):
    add_rule("spam.top/", category="phishing", source="test")
    add_rule("pills.click/", category="spam", source="test")
    build_filter()


class PostForm(forms.Form):
    body = forms.CharField(validators=[validate_no_listed_links])


def test_a_form_refuses_a_listed_link_and_names_it(listed):
    form = PostForm({"body": "Hi! Cheap at WWW.SPAM.TOP/deal and pills.click/x, see news.top/"})
    assert not form.is_valid()
    [error] = form.errors.as_data()["body"]
    assert error.code == "listed_link"
    message = form.errors["body"][0]
    assert "http://WWW.SPAM.TOP/deal (Phishing)" in message
    assert "http://pills.click/x (Spam)" in message
    assert "news.top" not in message


def test_clean_text_passes(listed):
    assert PostForm(
        {"body": "Read https://news.example/story and www.docs.example.org."}
    ).is_valid()
    validate_no_listed_links("")
    validate_no_listed_links(None)


def test_a_model_field_runs_it(listed):
    field = models.TextField(validators=[NoListedLinksValidator()])
    with pytest.raises(ValidationError) as raised:
        field.run_validators("spam.top/x")
    assert raised.value.error_list[0].code == "listed_link"
    field.run_validators("fine.example/x")


def test_categories_and_message(listed):
    only_phishing = NoListedLinksValidator(
        categories=["phishing"], message="No such links: %(links)s"
    )
    only_phishing("pills.click/x")  # spam: not this validator's concern
    with pytest.raises(ValidationError, match=r"No such links: http://spam.top/x \(Phishing\)"):
        only_phishing("pills.click/x spam.top/x")


def test_a_wrong_category_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown category fishing; the categories are"):
        NoListedLinksValidator(categories=["fishing"])
    with pytest.raises(TypeError, match="a list of category names"):
        NoListedLinksValidator(categories="phishing")


def test_it_is_deconstructible():
    validator = NoListedLinksValidator(categories=["phishing"], message="no")
    path, args, kwargs = validator.deconstruct()
    assert path == "urlguard.validators.NoListedLinksValidator"
    assert kwargs == {"categories": ["phishing"], "message": "no"}
    assert NoListedLinksValidator(*args, **kwargs) == validator
    written, imports = MigrationWriter.serialize(validate_no_listed_links)
    assert written == "urlguard.validators.NoListedLinksValidator()"
    assert imports == {"import urlguard.validators"}


def test_text_too_long_is_refused_clearly(listed, settings):
    settings.URLGUARD = {**settings.URLGUARD, "CONTENT_MAX_CHARS": 10}
    with pytest.raises(ValidationError) as raised:
        validate_no_listed_links("x" * 11)
    assert raised.value.code == "text_too_long"
    assert "11 characters, at most 10" in raised.value.messages[0]


def test_links_that_cannot_be_checked_are_refused_when_failing_closed(use_guard):
    use_guard(Guard(lambda: None, on_filter_error="closed"))
    with pytest.raises(ValidationError) as raised:
        validate_no_listed_links("see news.top/x")
    assert raised.value.code == "unchecked_link"
    assert "could not be checked right now" in raised.value.messages[0]
