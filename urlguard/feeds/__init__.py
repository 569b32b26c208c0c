"""Subscribed feeds: fetch a source (fetching), open its body (decoding), read its
entries as their publisher ships them (formats), keep feeds from blocking allowlisted
hosts whole (urlguard.writepath.allowlist), and apply what changed since last time
through urlguard.writepath.changes (refresh). Celery tasks and the embedded runner keep
them current."""
