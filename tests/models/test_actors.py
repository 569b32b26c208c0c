"""Who did it is `actor` in the Python code. The models whose column has another name
(AdminJob.created_by, SpamRule.added_by, AllowedHost.added_by: kept, as nodes of two
releases share the table) answer to `actor` too, and a job row written under the
column's name, as an older node writes it, runs with that user as its actor."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import AnonymousUser

from urlguard.jobs import reverts
from urlguard.models import AdminJob, AllowedHost, ChangeEvent, ChangeSet, SpamRule, row_user
from urlguard.writepath import changes
from urlguard.writepath.allowlist import allow_host

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("quiet")]


@pytest.fixture
def ann(django_user_model):
    return django_user_model.objects.create_user("ann")


def test_actor_is_the_column_read_and_set(ann):
    rule = changes.add_rule("evil.example/", category="spam", actor=ann)
    rule = SpamRule.objects.get(pk=rule.pk)
    assert rule.added_by == rule.actor == ann
    entry = allow_host("partner.example", actor=ann).entry
    entry = AllowedHost.objects.get(pk=entry.pk)
    assert entry.added_by == entry.actor == ann
    job = AdminJob.objects.create(kind=AdminJob.Kind.IMPORT, created_by=ann)
    assert job.actor == ann
    job.actor = None
    job.save()
    assert AdminJob.objects.get(pk=job.pk).created_by is None


def test_actor_is_a_keyword_of_the_models_constructor(ann):
    job = AdminJob.objects.create(kind=AdminJob.Kind.IMPORT, actor=ann)
    assert AdminJob.objects.get(pk=job.pk).created_by == ann
    assert AllowedHost(host="partner.example", actor=ann).added_by == ann


@pytest.mark.parametrize("name", ["created_by", "actor"])
def test_a_job_row_under_either_name_runs_with_its_user_as_the_actor(ann, name):
    changes.add_rule("evil.example/", category="spam", actor=ann)
    change_set = ChangeEvent.objects.get(expression="evil.example/").change_set
    job = AdminJob.objects.create(
        kind=AdminJob.Kind.REVERT,
        params={"phase": "commit", "change_set": change_set.pk},
        **{name: ann},
    )
    reverts.revert_job(job.pk)  # the Celery task as a worker calls it: the job's id only
    job.refresh_from_db()
    assert job.state == AdminJob.State.DONE, job.message
    revert = ChangeSet.objects.get(kind=ChangeSet.Kind.REVERT)
    assert revert.actor == ann
    assert not SpamRule.objects.filter(expression="evil.example/").exists()


def test_only_a_logged_in_user_becomes_a_rows_actor(ann):
    assert row_user(ann) == ann
    assert row_user(AnonymousUser()) is None
    assert row_user(None) is None
