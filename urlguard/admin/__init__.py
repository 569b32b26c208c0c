"""The operators' GUI, built on Django's admin: spam rules (add from a pasted URL with
a preview, import, check a URL, filter dashboard), short links (verdicts, rescan;
registered by urlguard.shortlinks), and the read-only change log. Every rule write
goes through urlguard.writepath.changes."""

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
