"""The app's shared fixtures (tests/support/fixtures.py) for the tests in this folder,
and the two ways a feed's body is staged."""

import pytest

from tests.support.fixtures import *  # noqa: F403
from urlguard.feeds import partitions


@pytest.fixture(params=["whole", "in-partitions"])
def whole_and_in_partitions(request, monkeypatch):
    """A refresh scenario run twice: with its bodies staged whole (as a feed of up to
    PARTITION_ENTRIES is), then with every body of an entry or more staged in 8
    partitions on disk (as a bigger one is), asserting the same outcomes."""
    if request.param == "whole":
        yield None
        return
    monkeypatch.setattr(partitions, "PARTITION_ENTRIES", 0)
    monkeypatch.setattr(partitions, "PARTITION_SIZE", 0)
    monkeypatch.setattr(partitions, "_MAX_BITS", 3)
    made: list[partitions.Partitioned] = []
    real = partitions.Partitioned.__init__

    def counted(self, *args, **kwargs):
        real(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(partitions.Partitioned, "__init__", counted)
    yield made
    assert made, "no body was staged in partitions"
