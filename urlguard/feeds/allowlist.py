"""Hosts that feeds may never block whole: every host an enabled allowlist source
names, and each parent domain of one. A feed's rule at domain or subdomain level
(`host/`) on such a host is refused; a rule on a path or page of it is accepted
(URLhaus lists malware on big hosting platforms that way). A person adding such a
rule by hand gets a warning instead (see `warning`)."""

from __future__ import annotations

import hashlib

from urlguard.canonical import split_expression
from urlguard.models import AllowedHost

__all__ = ["Allowlist", "load", "warning"]


class Allowlist:
    """The protected hosts, loaded once per refresh: lookups are set membership."""

    def __init__(self, hosts: dict[str, str]):
        # host -> the allowlisted host (and its source) it protects
        self._protected: dict[str, str] = {}
        for host, why in sorted(hosts.items()):
            labels = host.split(".")
            for i in range(len(labels) - 1):
                parent = ".".join(labels[i:])
                self._protected.setdefault(parent, why if i == 0 else f"{why} (a parent of it)")
            self._protected.setdefault(host, why)

    def __len__(self) -> int:
        return len(self._protected)

    def digest(self) -> str:
        """Names the set of protected hosts (a memo made under another is stale)."""
        digest = hashlib.blake2b(digest_size=16)
        for host in sorted(self._protected):
            digest.update(host.encode("utf-8", "surrogatepass") + b"\n")
        return digest.hexdigest()

    def refusal(self, expression: str) -> str | None:
        """Why a feed may not list `expression` (None: it may)."""
        if not self._protected:
            return None
        host, path = split_expression(expression)
        if path != "/":
            return None
        why = self._protected.get(host)
        if why is None:
            return None
        return (
            f"{host}/ would block a whole host the allowlist protects: {why}; "
            "only rules on a path or page of it are accepted from feeds"
        )


def load() -> Allowlist:
    rows = AllowedHost.objects.filter(source__enabled=True, source__is_allowlist=True)
    hosts: dict[str, str] = {}
    for host, source in rows.values_list("host", "source__name").iterator(chunk_size=5000):
        hosts.setdefault(host, f"{host} is allowlisted by {source!r}")
    return Allowlist(hosts)


def warning(expression: str) -> str | None:
    """For a rule added by hand: the allowlist's objection, to show (not enforce)."""
    return load().refusal(expression)
