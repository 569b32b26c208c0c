"""Guarding operators against over-broad rules: which level the add form proposes for
a pasted URL (the narrowest that covers what was evidently meant), and why a rule
needs an explicit confirmation before it is saved (a popular domain, a link
shortener, a shared hosting platform, this service's own host, or too many links
blocked at once).

The shipped lists are deliberately short and boring: they catch the slips an operator
makes on a busy day (pasting a Google Forms phishing link and saving `google.com/`),
not every site that matters. PROTECTED_HOSTS and LINK_SHORTENERS replace them."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import publicsuffixlist
from django.conf import settings

from urlguard.conf import conf
from urlguard.hotpath.canonical import split_expression
from urlguard.hotpath.rollup import registrable_domain
from urlguard.writepath.rules import RuleCandidate

__all__ = [
    "DEFAULT_LINK_SHORTENERS",
    "DEFAULT_PROTECTED_HOSTS",
    "Confirmation",
    "confirmations",
    "confirmations_many",
    "default_candidate",
    "is_shared_platform",
]

# Sites whose subpages are often abused (forms, sites, docs, storage, social posts)
# while the site itself is used by everyone.
DEFAULT_PROTECTED_HOSTS: tuple[str, ...] = (
    "google.com",
    "youtube.com",
    "facebook.com",
    "instagram.com",
    "whatsapp.com",
    "twitter.com",
    "x.com",
    "linkedin.com",
    "microsoft.com",
    "live.com",
    "office.com",
    "sharepoint.com",
    "onedrive.com",
    "apple.com",
    "icloud.com",
    "amazon.com",
    "wikipedia.org",
    "github.com",
    "githubusercontent.com",
    "gitlab.com",
    "dropbox.com",
    "box.com",
    "reddit.com",
    "yahoo.com",
    "bing.com",
    "duckduckgo.com",
    "telegram.org",
    "t.me",
    "discord.com",
    "discord.gg",
    "zoom.us",
    "paypal.com",
    "wordpress.com",
    "medium.com",
    "notion.so",
    "canva.com",
    "mozilla.org",
    "cloudflare.com",
    "tiktok.com",
    "pinterest.com",
    "yandex.ru",
    "baidu.com",
    "weebly.com",
    "squarespace.com",
    "shopify.com",
    "mailchimp.com",
    "typeform.com",
    "forms.gle",
)

DEFAULT_LINK_SHORTENERS: tuple[str, ...] = (
    "bit.ly",
    "bitly.com",
    "t.co",
    "tinyurl.com",
    "goo.gl",
    "ow.ly",
    "is.gd",
    "v.gd",
    "buff.ly",
    "rebrand.ly",
    "cutt.ly",
    "shorturl.at",
    "tiny.cc",
    "lnkd.in",
    "rb.gy",
    "s.id",
    "t.ly",
    "bit.do",
    "dub.sh",
    "short.io",
    "tr.im",
    "qrco.de",
    "shorturl.com",
    "soo.gd",
    "clck.ru",
    "surl.li",
    "urlz.fr",
    "x.gd",
)


@dataclass(frozen=True, slots=True)
class Confirmation:
    """Why a rule needs "yes, I mean it": `code` is stable (tests, CSS), `reason` is
    the sentence the operator reads."""

    code: str
    reason: str


def _host_list(value: object, default: tuple[str, ...]) -> frozenset[str]:
    hosts = default if value is None else value
    return frozenset(str(h).strip().lower().strip(".") for h in hosts if str(h).strip())  # type: ignore[attr-defined]


def protected_hosts() -> frozenset[str]:
    return _host_list(conf.PROTECTED_HOSTS, DEFAULT_PROTECTED_HOSTS)


def link_shorteners() -> frozenset[str]:
    return _host_list(conf.LINK_SHORTENERS, DEFAULT_LINK_SHORTENERS)


def _suffixes(host: str) -> list[str]:
    """host and each parent domain: a.b.c -> [a.b.c, b.c, c]."""
    labels = host.split(".")
    return [".".join(labels[i:]) for i in range(len(labels))]


def _listed(host: str, listed: frozenset[str]) -> str | None:
    """The entry of `listed` that is `host` or one of its parents up to its registrable
    domain, if any: a customer's site on a hosting platform (foo.blogspot.com) is its
    own registrable domain, not part of the platform."""
    domain = registrable_domain(host) or host
    candidates = _suffixes(host)
    if domain in candidates:
        candidates = candidates[: candidates.index(domain) + 1]
    return next((h for h in candidates if h in listed), None)


@functools.cache
def _platform_parents() -> frozenset[str]:
    """Registrable domains that have shared-hosting suffixes under them (the private
    section of the public suffix list): `amazonaws.com` holds `s3.amazonaws.com`, so
    a rule on it blocks every customer's site at once."""

    data = Path(publicsuffixlist.__file__).with_name("public_suffix_list.dat")
    parents: set[str] = set()
    private = False
    with data.open(encoding="utf-8") as lines:
        for line in lines:
            line = line.strip()
            if "===BEGIN PRIVATE DOMAINS===" in line:
                private = True
                continue
            if not private or not line or line.startswith("//"):
                continue
            suffix = line.lstrip("!*.").encode("idna").decode("ascii")
            parents.update(_suffixes(suffix)[1:])
    # Only real domains: "com" above "blogspot.com" is a public suffix, refused anyway.
    return frozenset(p for p in parents if registrable_domain(p) is not None)


def is_shared_platform(host: str) -> bool:
    """True if `host` is (or is under) a popular site or a link shortener, or is a
    domain with shared-hosting suffixes under it: there one page is not the whole host.
    A customer's own site on such a platform (evil.github.io) is its own host."""
    return (
        _listed(host, protected_hosts()) is not None
        or _listed(host, link_shorteners()) is not None
        or host in _platform_parents()
    )


def default_candidate(text: str, candidates: list[RuleCandidate]) -> RuleCandidate | None:
    """The level the add form proposes for pasted `text`: the narrowest one that covers
    what was evidently meant. A bare host or expression means exactly that; a URL on a
    shared platform (a shortener, a popular site, a hosting platform) means its page;
    any other URL means its exact host, never a registrable domain nobody typed, except
    that `www.` before a registrable domain means the domain itself (the spammer's own:
    a rule on www. alone would leave the bare domain open)."""
    if not candidates:
        return None
    hosts = [c for c in candidates if c.level in ("domain", "subdomain")]
    exact_host = hosts[-1] if hosts else candidates[0]
    host, _ = split_expression(exact_host.expression)
    pasted_path = "://" in text or "/" in text.strip().rstrip("/")
    if is_shared_platform(host) and pasted_path:
        pages = [c for c in candidates if c.level == "page"]
        # The page with any query (not the exact query, which a spammer varies).
        plain = [c for c in pages if "?" not in c.expression]
        if plain or pages:
            return (plain or pages)[0]
        paths = [c for c in candidates if c.level == "path"]
        if paths:
            return paths[-1]
    domain = next((c for c in hosts if c.level == "domain"), None)
    if domain is not None and f"www.{domain.expression}" == exact_host.expression:
        return domain
    return exact_host


def own_hosts(request_host: str | None = None) -> frozenset[str]:
    """This service's own host names: ALLOWED_HOSTS (without wildcards), the public
    name (PUBLIC_URL: behind a proxy ALLOWED_HOSTS may name only internal ones) and the
    host the request came in on."""
    hosts = {h.lower().lstrip(".").split(":")[0] for h in settings.ALLOWED_HOSTS if h and h != "*"}
    public = urlsplit(conf.PUBLIC_URL).hostname if conf.PUBLIC_URL else None
    if public:
        hosts.add(public.lower())
    if request_host:
        hosts.add(request_host.lower().split(":")[0].strip("[]"))
    return frozenset(h for h in hosts if h)


def confirmations(
    expression: str, *, request_host: str | None = None, blocked_links: int | None = None
) -> list[Confirmation]:
    """Every reason `expression` needs an explicit confirmation, empty when none."""
    host, path = split_expression(expression)
    whole_host = path == "/"
    found: list[Confirmation] = []
    own = own_hosts(request_host)
    hit = next((h for h in own if h == host or h.endswith("." + host)), None)
    if hit is not None and whole_host:
        found.append(
            Confirmation(
                "own-host",
                f"{host} is this service's own host ({hit}): the rule would block links to "
                "this service itself",
            )
        )
    if whole_host:
        if (popular := _listed(host, protected_hosts())) is not None:
            found.append(
                Confirmation(
                    "popular",
                    (f"{host} is part of {popular}," if popular != host else f"{host} is")
                    + " a popular "
                    "site on the protected hosts list: the rule blocks everyone's links to it, "
                    "not just the spam page; block the page or path instead",
                )
            )
        if (short := _listed(host, link_shorteners())) is not None:
            found.append(
                Confirmation(
                    "shortener",
                    f"{short} is a link shortener: the rule blocks every short link of it, "
                    "good and bad; block the one short link (its page) instead",
                )
            )
        if host in _platform_parents():
            found.append(
                Confirmation(
                    "platform",
                    f"{host} hosts other people's sites (the public suffix list names "
                    "shared-hosting suffixes under it): the rule blocks all of them; "
                    "block the one site instead",
                )
            )
    threshold = conf.CONFIRM_IMPACT_LINKS
    if blocked_links is not None and threshold and blocked_links > threshold:
        found.append(
            Confirmation(
                "impact",
                f"the rule would block {blocked_links:,} short links, more than "
                f"CONFIRM_IMPACT_LINKS={threshold:,}",
            )
        )
    return found


def confirmations_many(
    rule_expressions: Iterable[str], *, blocked_links: Mapping[str, int] | None = None
) -> dict[str, list[Confirmation]]:
    """confirmations() of many expressions (a feed refresh's new entries), only those
    that need one: the host lists are resolved once, and a whole-host rule whose host
    and parents are on none of them is passed without the full check."""
    blocked_links = blocked_links or {}
    threshold = conf.CONFIRM_IMPACT_LINKS
    listed = protected_hosts() | link_shorteners() | _platform_parents()
    own = frozenset(suffix for host in own_hosts() for suffix in _suffixes(host))
    found: dict[str, list[Confirmation]] = {}
    for expression in rule_expressions:
        host, path = split_expression(expression)
        links = blocked_links.get(expression)
        suspect = path == "/" and (host in own or any(s in listed for s in _suffixes(host)))
        if suspect or (threshold and links is not None and links > threshold):
            reasons = confirmations(expression, blocked_links=links)
            if reasons:
                found[expression] = reasons
    return found
