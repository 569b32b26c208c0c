"""What a rule would block, before it is saved: the candidate expressions for a
pasted URL (the narrowest sensible one proposed), and for the chosen one the short
links it would block (urlguard.writepath.impact), the confirmations it needs
(urlguard.writepath.safety), and sample URLs sorted into "blocked" and "not blocked" by the
real matcher (urlguard.writepath.rules.rule_matches), never by guesswork. Used by the add form
(server-rendered) and its live-preview JSON endpoint."""

from __future__ import annotations

from collections.abc import Iterable

from urlguard.hotpath.canonical import expressions
from urlguard.models import SpamRule
from urlguard.writepath.impact import impact_of_adding
from urlguard.writepath.rules import RuleError, rule_candidates, rule_matches
from urlguard.writepath.safety import confirmations, default_candidate

# The person's own test URLs per preview: a screenful to compare, not a bulk checker
# (each is matched in this request).
MAX_EXTRA_SAMPLES = 20


def sample_urls(expression: str, pasted: str) -> list[str]:
    """URLs near the edge of what `expression` covers: the pasted one, deeper hosts
    and paths that fall inside it, and look-alikes, parents and siblings that fall
    outside. Which side each lands on is decided afterwards by rule_matches."""
    host, _, rest = expression.partition("/")
    path = "/" + rest
    labels = host.split(".")
    samples = [pasted, f"http://{host}{path}"]
    directory = path if path.endswith("/") else path.rsplit("/", 1)[0] + "/"
    samples += [
        f"https://www.{host}{directory}login.php?session=1",
        f"http://cdn.{host}{path}",
        f"https://{host}{directory}deeper/page.html",
    ]
    if len(labels) > 2:
        parent = ".".join(labels[1:])
        samples += [f"https://{parent}/", f"https://other.{parent}{path}"]
    samples += [
        f"http://{host}.example.net{path}",  # the rule's host as a label of another domain
        f"https://not-{host}{path}",  # a look-alike name
    ]
    if path != "/":
        samples.append(f"https://{host}/")
        stem = path.rstrip("/")
        samples.append(f"https://{host}{stem}-other/")
    return list(dict.fromkeys(s for s in samples if s))


def rule_preview(
    text: str,
    expression: str | None,
    extra_samples: Iterable[str],
    *,
    request_host: str | None = None,
) -> dict:
    """A JSON-ready dict: `error` (why the text cannot be a rule, or None),
    `candidates` [{level, expression, help}], `expression` (the chosen one, by
    default the narrowest that covers what was pasted), `existing` (rules already
    covering the pasted URL), `impact` (urlguard.writepath.impact.Impact.as_dict() of the
    chosen expression), `confirmations` [{code, reason}] it needs, and `samples`
    [{url, blocked}] for the chosen expression: ours, then the person's own
    `extra_samples` (blank ones dropped, the first MAX_EXTRA_SAMPLES kept)."""
    text = text.strip()
    out: dict = {
        "text": text,
        "error": None,
        "candidates": [],
        "expression": None,
        "existing": [],
        "impact": None,
        "confirmations": [],
        "samples": [],
    }
    if not text:
        out["error"] = "Paste a URL, a host or an expression."
        return out
    try:
        candidates = rule_candidates(text)
    except (RuleError, ValueError) as exc:
        out["error"] = str(exc)
        return out
    out["candidates"] = [
        {"level": c.level, "expression": c.expression, "help": c.description} for c in candidates
    ]
    if not candidates:
        out["error"] = "Nothing in this text can be blocked."
        return out
    chosen = {c.expression for c in candidates}
    proposed = default_candidate(text, candidates) or candidates[0]
    out["default"] = proposed.expression
    out["expression"] = expression if expression in chosen else proposed.expression
    impact = impact_of_adding([out["expression"]])
    out["impact"] = impact.as_dict()
    out["confirmations"] = [
        {"code": c.code, "reason": c.reason}
        for c in confirmations(
            out["expression"],
            request_host=request_host,
            blocked_links=impact.links if impact.exact else None,
        )
    ]
    # A bare host or expression is what a person pastes as often as a URL.
    pasted_url = text if "://" in text else f"http://{text}"
    try:
        covering = expressions(pasted_url)
    except ValueError:
        covering = []
    out["existing"] = (
        [
            {"expression": r.expression, "category": r.get_category_display(), "id": r.pk}
            for r in SpamRule.objects.filter(expression__in=covering)
        ]
        if covering
        else []
    )
    extra = [url.strip() for url in extra_samples if url.strip()][:MAX_EXTRA_SAMPLES]
    for url in dict.fromkeys([*sample_urls(out["expression"], pasted_url), *extra]):
        try:
            blocked = rule_matches(out["expression"], url)
        except ValueError as exc:
            out["samples"].append({"url": url, "blocked": None, "error": str(exc)})
            continue
        out["samples"].append({"url": url, "blocked": bool(blocked), "error": None})
    return out
