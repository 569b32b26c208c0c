"""Short-link creation: the shortest free slug, found with a ScalableBloomFilter of the
slugs in use (the "ID manager" job of the scalable filter), and the checks on a
custom slug and on the destination.

The filter only says which candidates are certainly free, so most allocations cost
one INSERT and no lookup; the database's unique constraint stays the authority (a
slug taken by another process is caught as an IntegrityError and the next candidate
is tried). The filter is rebuilt from the ShortLink table on first use per process."""

from __future__ import annotations

import logging
import re
import secrets
import threading
from itertools import islice

from django.db import IntegrityError, transaction

from filterengine import ScalableBloomFilter
from urlguard.hotpath.canonical import canonicalize
from urlguard.models import ShortLink
from urlguard.runtime.process import on_reset

__all__ = ["ALPHABET", "SlugError", "allocate_slug", "create_short_link", "reset"]

log = logging.getLogger(__name__)

#: Characters of generated slugs: lowercase letters and digits without the ones
#: people misread (0/o, 1/l/i), so a slug read aloud or from paper still works.
ALPHABET = "23456789abcdefghjkmnpqrstuvwxyz"
#: A custom slug: what Django's <slug:> path converter routes, up to the column's length.
CUSTOM_SLUG = re.compile(r"[-a-zA-Z0-9_]{1,64}")
#: Paths the site itself uses: a short link there would be shadowed or shadow them.
RESERVED = frozenset(
    {
        "admin",
        "api",
        "continue",
        "static",
        "media",
        "favicon.ico",
        "robots.txt",
        "health",
        "login",
        "logout",
    }
)
MAX_DESTINATION: int = ShortLink._meta.get_field("destination").max_length or 0

# A length whose every candidate can be probed cheaply is scanned in full, so the
# shortest free slug is found exactly; longer lengths are sampled at random (a
# random slug is also not guessable from its neighbours).
_SCAN_LIMIT = len(ALPHABET) ** 2
_SAMPLES = 24
_MAX_ATTEMPTS = 50

_lock = threading.Lock()
_used: ScalableBloomFilter | None = None
_full_lengths: set[int] = set()


class SlugError(ValueError):
    """A custom slug that cannot be used (bad characters, reserved, or taken)."""


@on_reset
def reset() -> None:
    """Forget this process's slug filter (tests; after bulk deletes). Rebuilt on next use."""
    with _lock:
        _forget()


def _forget() -> None:
    # Caller holds _lock.
    global _used
    _used = None
    _full_lengths.clear()


def _filter() -> ScalableBloomFilter:
    # Caller holds _lock.
    global _used
    if _used is None:
        slugs = ShortLink.objects.values_list("slug", flat=True)
        count = slugs.count()
        used = ScalableBloomFilter(max(1024, 2 * count), 0.01)
        for slug in slugs.iterator(chunk_size=5000):
            used.add(slug)
        _used = used
        log.debug("slug filter rebuilt from %d short links", count)
    return _used


def _candidates():
    """Candidate slugs, shortest first, each one the filter says is certainly free."""
    length = 1
    while True:
        if length not in _full_lengths:
            used = _filter()
            if len(ALPHABET) ** length <= _SCAN_LIMIT:
                pool = [_nth(i, length) for i in range(len(ALPHABET) ** length)]
                secrets.SystemRandom().shuffle(pool)
                pool = [s for s in pool if s not in RESERVED]
                maybe_used = [s for s in pool if s in used]
                yield from (s for s in pool if s not in used)
                # Certainly-free candidates are exhausted; the filter's false
                # positives hide ~1% of free slugs: one query finds them.
                taken = set(
                    ShortLink.objects.filter(slug__in=maybe_used).values_list("slug", flat=True)
                )
                yield from (s for s in maybe_used if s not in taken)
                _full_lengths.add(length)
            else:
                for _ in range(_SAMPLES):
                    slug = "".join(secrets.choice(ALPHABET) for _ in range(length))
                    if slug not in used and slug not in RESERVED:
                        yield slug
        length += 1


def _nth(i: int, length: int) -> str:
    out = []
    for _ in range(length):
        i, r = divmod(i, len(ALPHABET))
        out.append(ALPHABET[r])
    return "".join(out)


def _try_insert(slug: str, destination: str) -> ShortLink | None:
    """The link, or None if the slug was taken (by another process: the filter's
    "certainly free" only covers the slugs this process knows)."""
    try:
        with transaction.atomic():  # a savepoint: an outer transaction survives the clash
            link = ShortLink.objects.create(slug=slug, destination=destination)
    except IntegrityError:
        return None
    finally:
        _filter().add(slug)
    return link


def allocate_slug() -> str:
    """The shortest slug that is free now (not reserved; no row holds it yet).

    Without a row it is only a proposal: create_short_link() claims one atomically."""
    with _lock:
        slug = _first_unused(1)
        if slug is None:
            _forget()  # stale behind other processes: see create_short_link
            slug = _first_unused(None)
    assert slug is not None, "unreachable: _candidates() is endless"
    return slug


def _first_unused(attempts: int | None) -> str | None:
    # Caller holds _lock.
    for slug in islice(_candidates(), attempts):
        if not ShortLink.objects.filter(slug=slug).exists():
            return slug
        _filter().add(slug)  # another process took it: remember
    return None


def validate_destination(destination: str) -> str:
    """The destination to store (stripped), or ValueError saying what is wrong with it."""
    if not isinstance(destination, str):
        raise TypeError(f"destination must be a str, not {type(destination).__name__}")
    destination = destination.strip()
    if not destination:
        raise ValueError("the destination is empty")
    if len(destination) > MAX_DESTINATION:
        raise ValueError(
            f"the destination is {len(destination)} characters long; the limit is {MAX_DESTINATION}"
        )
    try:
        canonicalize(destination)
    except ValueError as exc:
        raise ValueError(
            f"the destination {destination[:200]!r} is not a usable http(s) URL: {exc}"
        ) from None
    return destination


def validate_slug(slug: str) -> str:
    if not isinstance(slug, str) or not CUSTOM_SLUG.fullmatch(slug):
        raise SlugError(f"the slug {slug!r} must be 1 to 64 letters, digits, '-' or '_'")
    if slug.lower() in RESERVED:
        raise SlugError(f"the slug {slug!r} is reserved for the site's own pages")
    return slug


def create_short_link(destination: str, *, slug: str | None = None) -> ShortLink:
    """A new ShortLink to `destination` under `slug`, or under the shortest free slug.

    ValueError for a destination that is not a usable http(s) URL; SlugError (a
    ValueError) for a custom slug with bad characters, reserved, or already taken."""
    destination = validate_destination(destination)
    if slug is not None:
        validate_slug(slug)
        with _lock:
            link = _try_insert(slug, destination)
        if link is None:
            raise SlugError(f"the slug {slug!r} is already taken")
        return link
    with _lock:
        link = _first_free(destination, 1)
        if link is None:
            # A collision: other processes have taken slugs since this one built its
            # filter, and it believes them all free. Rebuild it from the table once
            # rather than collide through them one INSERT at a time.
            _forget()
            link = _first_free(destination, _MAX_ATTEMPTS)
    if link is None:
        # Only if other processes keep taking every candidate this one proposes.
        raise RuntimeError(
            f"no free slug after {_MAX_ATTEMPTS} attempts, each taken "
            "meanwhile by another process; try again"
        )
    return link


def _first_free(destination: str, attempts: int) -> ShortLink | None:
    # Caller holds _lock.
    for candidate in islice(_candidates(), attempts):
        link = _try_insert(candidate, destination)
        if link is not None:
            return link
    return None
