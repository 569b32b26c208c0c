"""The operators' GUI, built on Django's admin: spam rules (add from a pasted URL with
a preview, import, bulk delete, check a URL, filter dashboard), sources and feeds, the
allowlist, the report queue, rule hits, API keys, short links (verdicts, rescan;
registered where urlguard.shortlinks is installed), and the read-only change log with
its change sets and their revert. Every rule write goes through urlguard.writepath.changes."""

from urlguard.admin import (  # noqa: F401  (registers)
    allowlist,
    apikeys,
    changelog,
    changesets,
    hits,
    links,
    reportqueue,
    rules,
    sources,
)
