"""Jobs are numbered per kind: the first refresh is refresh #1 whatever imports ran
before it, and a change set names the import by the number its page shows."""

from __future__ import annotations

import pytest

from urlguard.models import AdminJob, ChangeSet

pytestmark = pytest.mark.django_db


def test_each_kind_counts_on_its_own():
    imports = [AdminJob.objects.create(kind="import") for _ in range(3)]
    refresh = AdminJob.objects.create(kind="refresh")
    later = AdminJob.objects.create(kind="import")
    assert [job.number for job in imports] == [1, 2, 3]
    assert refresh.number == 1 and str(refresh) == "Feed refresh #1 (queued)"
    assert later.number == 4


def test_a_change_set_says_it_is_a_change_set():
    cs = ChangeSet.objects.create(kind="import")
    assert str(cs) == f"Change set #{cs.pk} (import)"
