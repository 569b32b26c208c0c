"""Keeping this node's filter file equal to the spam table: the process-wide registry of
the mapped file, the change-log sync and rebuild, the nudge that tells every node a change
committed, the embedded upkeep thread (no broker), the Celery tasks and worker hooks, and
each node's status row."""
