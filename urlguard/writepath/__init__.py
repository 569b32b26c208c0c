"""The write path: rules parsed from what a person pastes, the one transaction that writes a rule
with its change-log event (urlguard.writepath.changes), change sets and their revert, the
allowlist, imports, and the impact and safety checks shown before a change is made."""
