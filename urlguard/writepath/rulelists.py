"""The pieces every rule-list reader shares: the entry type (ParsedLine), how one
entry's text becomes a rule expression (or a refusal), the hosts-file and comment
conventions, and the CSV row reader. Pure parsing, no database.

Two readers build on it: urlguard.writepath.importing (an uploaded file: plain list, hosts
file or CSV with a header, detected from its first line) and urlguard.feeds.formats
(a feed as its publisher ships it). The write path (urlguard.writepath.changes) takes the
entries they yield."""

from __future__ import annotations

import csv
import functools
import ipaddress
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from urlguard.writepath.rules import RuleError, normalize_rule

__all__ = [
    "HOSTS_FILE_SELF_NAMES",
    "EntryMaker",
    "ParsedLine",
    "csv_rows",
    "entry",
    "entry_text",
    "is_ip_address",
    "pending_entry",
    "refused",
    "without_comment",
]

_COMMENT_RE = re.compile(r"(?:^|(?<=\s))#")

# Names every hosts file maps to loopback or broadcast: they describe the machine
# itself, not something to block.
HOSTS_FILE_SELF_NAMES = frozenset(
    {
        "localhost",
        "localhost.localdomain",
        "local",
        "broadcasthost",
        "localhost4",
        "localhost4.localdomain4",
        "localhost6",
        "localhost6.localdomain6",
        "ip6-localhost",
        "ip6-loopback",
        "ip6-localnet",
        "ip6-mcastprefix",
        "ip6-allnodes",
        "ip6-allrouters",
        "ip6-allhosts",
        "0.0.0.0",
    }
)


@dataclass(slots=True)
class ParsedLine:
    """One entry of a rule list. `expression` is the rule to add (None when `error`
    says why the entry is refused). `duplicate_of` is the line number of an earlier
    entry with the same expression (then `error` is None: nothing is wrong, there is
    just nothing more to add)."""

    lineno: int
    raw: str
    expression: str | None
    category: str
    error: str | None = None
    note: str = ""
    duplicate_of: int | None = None
    # pending_entry's: the text normalize_rule is still to read (expression is None).
    token: str | None = None

    @property
    def is_new(self) -> bool:
        """True for an entry to add: no error and not a repeat within the file."""
        return self.error is None and self.duplicate_of is None


# Makes an entry of (lineno, raw line, text, category[, note]): `entry` normalizes
# it; `pending_entry` leaves that for later.
EntryMaker = Callable[..., ParsedLine]


def entry_text(text: str) -> str:
    """The part of a list's entry that names what to block."""
    if text.startswith("||"):
        # Adblock syntax: "||example.com^" is the domain and its subdomains; options
        # after '$' ("third-party", ...) do not change what is blocked here.
        text = text[2:].partition("$")[0].rstrip("^")
    return text


def entry(lineno: int, raw: str, text: str, category: str, note: str = "") -> ParsedLine:
    """One entry of a list: `text` normalized to a rule expression, or refused with
    the reason in `error`."""
    try:
        expression = normalize_rule(entry_text(text))
    except RuleError as exc:
        return ParsedLine(lineno, raw, None, category, error=str(exc), note=note)
    return ParsedLine(lineno, raw, expression, category, note=note)


def pending_entry(lineno: int, raw: str, text: str, category: str, note: str = "") -> ParsedLine:
    """entry() without the normalization: `token` holds what normalize_rule is to read
    (a feed refresh normalizes only the entries it has not seen before)."""
    return ParsedLine(lineno, raw, None, category, note=note, token=entry_text(text))


def refused(lineno: int, raw: str, category: str, reason: str, note: str = "") -> ParsedLine:
    """An entry refused for `reason` (nothing to normalize)."""
    return ParsedLine(lineno, raw.rstrip("\r\n"), None, category, error=reason, note=note)


@functools.lru_cache(maxsize=256)  # a hosts file repeats one or two addresses
def is_ip_address(token: str) -> bool:
    try:
        ipaddress.ip_address(token.split("%", 1)[0])  # "fe80::1%lo0"
    except ValueError:
        return False
    return True


def without_comment(text: str) -> str:
    # A comment starts at a '#' that begins a word; a '#' inside a URL is a fragment.
    match = _COMMENT_RE.search(text)
    return text if match is None else text[: match.start()]


def csv_rows(
    numbered: Iterator[tuple[int, str]],
    make: Callable[[int, str, list[str]], ParsedLine],
    *,
    delimiter: str = ",",
    skip_comments: bool = False,
    category: str = "",
    first_lineno: int = 0,
) -> Iterator[ParsedLine]:
    """The entries `make(lineno, raw, cells)` makes of the rows of CSV lines
    (`numbered`: (line number, line) pairs, with or without line endings), each row
    numbered by the line it starts on and `raw` its lines (a quoted field may span
    lines). Blank rows are skipped, and with `skip_comments` rows whose first cell
    starts with '#'. An unreadable row is refused (in `category`) and reading goes
    on. `first_lineno` numbers a row no line was read for."""
    linenos: list[int] = []
    consumed: list[str] = []

    def texts() -> Iterator[str]:
        for lineno, text in numbered:
            linenos.append(lineno)
            consumed.append(text.rstrip("\r\n"))
            # So that a quoted field spanning lines keeps its newline.
            yield text if text.endswith("\n") else text + "\n"

    reader = csv.reader(texts(), delimiter=delimiter)
    while True:
        del linenos[:], consumed[:]
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            if not linenos:  # nothing consumed: the reader cannot go on
                return
            raw = "\n".join(consumed)
            yield ParsedLine(linenos[0], raw, None, category, error=f"unreadable CSV row: {exc}")
            continue
        if not row or all(not cell.strip() for cell in row):
            continue
        if skip_comments and row[0].lstrip().startswith("#"):
            continue
        yield make(linenos[0] if linenos else first_lineno, "\n".join(consumed), row)
