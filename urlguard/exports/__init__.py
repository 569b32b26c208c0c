"""The curated list served to the operator's other enforcement points: block lists
over HTTP (`/lists/<name>`: hosts, domains, ABP with differential patches, rspamd
maps, an RPZ zone) and the DNS server (`manage.py serve_dns`). Each is a projection
of the rules at one change-log position (urlguard.exports.projection)."""
