"""Loaded by a Celery worker that a test starts with URLGUARD_TEST_KILL_AFTER=N
(tests.support.kill_settings): the worker SIGKILLs itself right after the N-th chunk
of rule writes committed, a fault at a known point instead of a sleep-then-kill race.
URLGUARD_TEST_CHUNK makes the chunks that small."""

import os
import signal

from urlguard.nodesync import nudge
from urlguard.writepath import changes, revert

_kill_after = int(os.environ.get("URLGUARD_TEST_KILL_AFTER", "0"))
_chunk = int(os.environ.get("URLGUARD_TEST_CHUNK", "0"))

if _kill_after:
    _committed = [0]

    def _nudge_then_die(seq):
        nudge.deliver(seq)
        _committed[0] += 1
        if _committed[0] >= _kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    # For the life of this process: entered, never left (held here, or collecting
    # the context manager would leave it).
    _sending = nudge.sending_to(_nudge_then_die)
    _sending.__enter__()

if _chunk:
    revert.BATCH = _chunk
    _real_add = changes.add_rules

    def _add_rules(*args, **kwargs):
        kwargs["chunk_size"] = _chunk
        return _real_add(*args, **kwargs)

    changes.add_rules = _add_rules
    # A feed's new entries on PostgreSQL take the set-based path.
    _real_add_listed = changes.add_listed

    def _add_listed(*args, **kwargs):
        kwargs["chunk_size"] = _chunk
        return _real_add_listed(*args, **kwargs)

    changes.add_listed = _add_listed
    # An import's and a revert's plan is applied in chunks of the same size.
    from urlguard.writepath import withdrawals

    def _sized(module, name):
        real = getattr(module, name)

        def sized(*args, **kwargs):
            kwargs["chunk_size"] = _chunk
            return real(*args, **kwargs)

        setattr(module, name, sized)

    _sized(changes, "withdraw_rules")
    _sized(changes, "remove_rules")
    _sized(withdrawals, "withdraw_ids")
