"""The full updates prepared with each position, off the request path: the pre-render
round of the exports (urlguard.exports.prerender, after a node applied changes) reads
the lists at the new position (urlguard.safebrowsing.prefixes) and writes each list's
RICE-coded whole beside them, so a client's first fetch of a million-rule list is a
file read."""

from __future__ import annotations

from filterengine.atomicfile import write_aside
from urlguard.conf import conf
from urlguard.exports import prerender
from urlguard.models import ChangeEvent
from urlguard.safebrowsing import prefixes
from urlguard.safebrowsing.threatlists import LISTS
from urlguard.safebrowsing.updates import RICE, full_set_path, hash_set

__all__ = ["current", "prepare_full_updates", "prepare_round"]


def prepare_full_updates() -> prefixes.ListsAt:
    """The lists at the current position and their RICE-coded full updates."""
    lists = prefixes.prepare()
    for name in LISTS:
        path = full_set_path(lists.seq, name)
        if not path.exists() and len(lists.prefixes[name]):
            write_aside(path, [hash_set(lists.prefixes[name], RICE).SerializeToString()])
    return lists


def prepare_round() -> None:
    """The pre-render round's job (urlguard.exports.prerender.AFTER_RENDERS), read at
    each round so that switching SAFEBROWSING_ENABLED off stops the work at once."""
    if conf.SAFEBROWSING_ENABLED:
        prepare_full_updates()


def current() -> prefixes.ListsAt:
    """The lists a request is answered from: those at the log's head where this node
    has them, else (the pre-render asked for them) the newest it keeps; a node that
    keeps none yet reads them now, once."""
    head = ChangeEvent.objects.head()
    kept = prefixes.load(head)
    if kept is not None:
        return kept
    prerender.request()
    for seq in reversed(prefixes.kept_positions()):
        kept = prefixes.load(seq)
        if kept is not None:
            return kept
    return prepare_full_updates()
