"""Reading a feed's entries as their publishers ship them, one parser per format,
each a generator over a text stream (nothing holds the whole list):

- ``urls``: one URL, host or expression per line, ``#`` comments (OpenPhish and most
  "URL list" feeds);
- ``hosts``: ``0.0.0.0 evil.example other.example``, the machine's own names ignored;
- ``adblock``: ``||evil.example^`` domain rules; ``!`` comments and the
  ``[Adblock Plus 2.0]`` header skipped; options, exceptions, cosmetic and pattern
  rules refused with the reason (never guessed into something broader or narrower);
- ``urlhaus-csv``: ``#`` comment lines, the last of which is the header
  ``# id,dateadded,url,url_status,...``, then quoted rows (category: malware);
- ``phishtank-csv`` and ``phishtank-json``: ``phish_id,url,...`` (category: phishing;
  rows not verified are refused).

``detect`` names the format from the first lines. Every parser yields
rulelists.ParsedLine objects: an expression, or an error saying why the entry is
refused."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, islice
from typing import TextIO

from urlguard.feeds.decoding import FeedError, line_blocks, numbered
from urlguard.writepath.rulelists import (
    HOSTS_FILE_SELF_NAMES,
    EntryMaker,
    ParsedLine,
    csv_rows,
    entry,
    is_ip_address,
    refused,
    without_comment,
)

__all__ = ["FORMATS", "LINE_FORMATS", "detect", "parse", "parse_line", "sniff"]

URLHAUS_HEADER = ("id", "dateadded", "url", "url_status")
PHISHTANK_HEADER = ("phish_id", "url")
_DETECT_LINES = 200
_JSON_READ = 1 << 16


def parse_urls(
    lines: Iterable[str], category: str, make: EntryMaker = entry
) -> Iterator[ParsedLine]:
    for lineno, text in _significant(lines, comments=("#",)):
        tokens = without_comment(text).split()
        if not tokens:
            continue
        if len(tokens) > 1:
            yield refused(
                lineno,
                text,
                category,
                f"{len(tokens)} items on one line; this format is one "
                "URL per line (a URL cannot contain a space)",
            )
            continue
        yield make(lineno, text, tokens[0], category)


def parse_hosts(
    lines: Iterable[str], category: str, make: EntryMaker = entry
) -> Iterator[ParsedLine]:
    for lineno, text in _significant(lines, comments=("#",)):
        tokens = without_comment(text).split()
        if not tokens:
            continue
        if is_ip_address(tokens[0]):
            names = tokens[1:]
            if not names:
                yield refused(lineno, text, category, "an address with no host name after it")
        else:
            names = tokens  # some "hosts" lists leave the address out
        for name in names:
            if name.lower() in HOSTS_FILE_SELF_NAMES or is_ip_address(name):
                continue
            yield make(lineno, text, name, category)


_ADBLOCK_DOMAIN_RE = re.compile(r"\|\|([^/^$|*]+)\^\|?")


def parse_adblock(
    lines: Iterable[str], category: str, make: EntryMaker = entry
) -> Iterator[ParsedLine]:
    for lineno, text in _significant(lines, comments=("!",)):
        rule = text.strip()
        if rule.startswith("[") and rule.endswith("]"):  # [Adblock Plus 2.0]
            continue
        reason = _adblock_refusal(rule)
        if reason is not None:
            yield refused(lineno, text, category, reason)
            continue
        match = _ADBLOCK_DOMAIN_RE.fullmatch(rule)
        if match is None:
            yield refused(
                lineno,
                text,
                category,
                "not a domain rule of the form ||host^ (pattern rules are not understood "
                "here, and are refused rather than guessed)",
            )
            continue
        yield make(lineno, text, match.group(1), category)


def _adblock_refusal(rule: str) -> str | None:
    if rule.startswith("@@"):
        return "an exception rule (@@) allows, it does not block"
    if "##" in rule or "#@#" in rule or "#?#" in rule or "#$#" in rule:
        return "a cosmetic (element hiding) rule: nothing to block at the URL level"
    if "$" in rule:
        options = rule.partition("$")[2]
        return (
            f"has options (${options}): they narrow the rule to some requests, which a "
            "redirect check cannot honour, so it is refused rather than broadened"
        )
    if rule.startswith("/") and rule.endswith("/") and len(rule) > 1:
        return "a regular-expression rule: not understood here"
    return None


def parse_urlhaus_csv(
    lines: Iterable[str], category: str, make: EntryMaker = entry
) -> Iterator[ParsedLine]:
    del category  # URLhaus lists malware distribution
    header: list[str] | None = None
    rows = numbered(lines)
    rows_start = 0
    for lineno, text in rows:
        stripped = text.strip()
        if stripped.startswith("#"):
            cells = [c.strip().lower() for c in next(csv.reader([stripped.lstrip("#")]))]
            if tuple(cells[: len(URLHAUS_HEADER)]) == URLHAUS_HEADER:
                header = cells
            continue
        rows_start = lineno
        first = text
        break
    else:
        return
    if header is None:
        raise FeedError(
            "not a URLhaus CSV dump: no '# id,dateadded,url,url_status,...' header line"
        )
    url_col = header.index("url")
    threat_col = header.index("threat") if "threat" in header else None
    yield from csv_rows(
        chain([(rows_start, first)], rows),
        lambda lineno, raw, row: _urlhaus_row(lineno, raw, row, url_col, threat_col, make),
        skip_comments=True,
    )


def _urlhaus_row(
    lineno: int, raw: str, row: list[str], url_col: int, threat_col: int | None, make: EntryMaker
) -> ParsedLine:
    if url_col >= len(row) or not row[url_col].strip():
        return refused(lineno, raw, "malware", f"{len(row)} column(s) and no URL")
    note = row[threat_col].strip() if threat_col is not None and threat_col < len(row) else ""
    return make(lineno, raw, row[url_col].strip(), "malware", note)


def parse_phishtank_csv(
    lines: Iterable[str], category: str, make: EntryMaker = entry
) -> Iterator[ParsedLine]:
    del category  # PhishTank lists phishing
    rows = numbered(lines)
    for lineno, text in rows:
        header = [c.strip().lower() for c in next(csv.reader([text.lstrip("\ufeff")]))]
        if not all(name in header for name in PHISHTANK_HEADER):
            raise FeedError(
                f"not a PhishTank CSV file: line {lineno} is not a header naming phish_id and url"
            )
        break
    else:
        return
    yield from csv_rows(
        rows,
        lambda lineno, raw, row: _phish(lineno, raw, dict(zip(header, row, strict=False)), make),
    )


def parse_phishtank_json(
    stream: TextIO, category: str, make: EntryMaker = entry
) -> Iterator[ParsedLine]:
    del category
    for index, item in enumerate(_json_array(stream), start=1):
        raw = json.dumps(item)[:300]
        if not isinstance(item, dict):
            yield refused(index, raw, "phishing", "an array item that is not an object")
            continue
        yield _phish(index, raw, item, make)


def _phish(lineno: int, raw: str, item: dict, make: EntryMaker) -> ParsedLine:
    url = str(item.get("url") or "").strip()
    if not url:
        return refused(lineno, raw, "phishing", "no url")
    verified = str(item.get("verified", "yes")).strip().lower()
    if verified in ("no", "false", "0"):
        return refused(lineno, raw, "phishing", "not verified by PhishTank")
    note = str(item.get("target") or "").strip()
    return make(lineno, raw, url, "phishing", note)


# -- detection ------------------------------------------------------------------------


def detect(head: list[str]) -> str:
    """The format of a body whose first lines are `head`."""
    text = "".join(head).lstrip("\ufeff").lstrip()
    if text.startswith(("[", "{")) and '"phish_id"' in text:
        return "phishtank-json"
    significant = [line.strip() for line in head if line.strip()]
    if not significant:
        return "urls"
    lowered = significant[0].lower().lstrip("\ufeff")
    if lowered.startswith(("<!doctype html", "<html", "<?xml", "<head")):
        raise FeedError("the body is an HTML or XML page, not a list: wrong content")
    if lowered.startswith("phish_id,") or lowered.startswith('"phish_id"'):
        return "phishtank-csv"
    for line in significant:
        if line.startswith("#"):
            cells = line.lstrip("#").replace('"', "").replace(" ", "").lower()
            if cells.startswith("id,dateadded,url"):
                return "urlhaus-csv"
    if lowered.startswith("[adblock") or any(line.startswith(("||", "@@")) for line in significant):
        return "adblock"
    for line in significant:
        if line.startswith(("#", "!")):
            continue
        tokens = line.split()
        if len(tokens) > 1 and is_ip_address(tokens[0]):
            return "hosts"
        return "urls"
    return "urls"


LineParser = Callable[[Iterable[str], str, EntryMaker], Iterator[ParsedLine]]

FORMATS: dict[str, LineParser] = {
    "urls": parse_urls,
    "hosts": parse_hosts,
    "adblock": parse_adblock,
    "urlhaus-csv": parse_urlhaus_csv,
    "phishtank-csv": parse_phishtank_csv,
}
STREAM_FORMATS = {"phishtank-json": parse_phishtank_json}
NAMES = (*FORMATS, *STREAM_FORMATS)


# Formats whose lines are independent entries: a line parses the same wherever it is.
LINE_FORMATS = frozenset({"urls", "hosts", "adblock"})


def sniff(stream: TextIO, fmt: str) -> tuple[str, TextIO | Iterable[str]]:
    """(the format, the whole stream again) for the text `stream`; `fmt` "auto"
    detects it from the first lines. The stream given back is a TextIO (read in
    pieces) for the JSON format, an iterable of lines for the others."""
    if fmt in STREAM_FORMATS:
        return fmt, stream
    if fmt == "auto" or not fmt:
        head = list(islice(stream, _DETECT_LINES))
        fmt = detect(head)
        if fmt in STREAM_FORMATS:
            return fmt, _Rewound("".join(head), stream)  # type: ignore[return-value]
        return fmt, _Lines(head, stream)
    if fmt not in FORMATS:
        raise FeedError(f"unknown format {fmt!r}; use one of auto, {', '.join(NAMES)}")
    return fmt, stream


def parse(
    stream: TextIO, fmt: str, category: str, *, make: EntryMaker = entry
) -> tuple[str, Iterator[ParsedLine]]:
    """(the format read, its entries) for the text `stream`; `fmt` "auto" detects.
    `make` makes each entry (see EntryMaker)."""
    fmt, text = sniff(stream, fmt)
    if fmt in STREAM_FORMATS:
        return fmt, STREAM_FORMATS[fmt](text, category, make)  # type: ignore[arg-type]
    return fmt, FORMATS[fmt](text, category, make)


def parse_line(
    fmt: str, line: str, lineno: int, category: str, make: EntryMaker = entry
) -> list[ParsedLine]:
    """The entries of one line of a LINE_FORMATS body (none for a comment)."""
    if fmt == "urls" and "#" not in line and "\ufeff" not in line:
        # Most lines of a URL list: one token, nothing to strip (what parse_urls
        # would find, at a fifth of the cost of its generators).
        tokens = line.split()
        if len(tokens) == 1:
            return [make(lineno, line.rstrip("\r\n"), tokens[0], category)]
        if not tokens:
            return []
    parsed = list(FORMATS[fmt]((line,), category, make))
    for item in parsed:
        item.lineno = lineno
    return parsed


# -- shared ---------------------------------------------------------------------------


def _significant(lines: Iterable[str], *, comments: tuple[str, ...]) -> Iterator[tuple[int, str]]:
    for lineno, line in numbered(lines):
        text = line.rstrip("\r\n")
        if lineno == 1:
            text = text.lstrip("\ufeff")
        stripped = text.strip()
        if stripped and not stripped.startswith(comments):
            yield lineno, text


class _Lines:
    """The lines of a stream whose first ones were already read for detection."""

    def __init__(self, head: list[str], rest: Iterable[str]):
        self._head = head
        self._rest = rest

    def __iter__(self) -> Iterator[str]:
        return chain(self._head, self._rest)

    def blocks(self, size: int = 1 << 20) -> Iterator[tuple[int, str]]:
        if self._head:
            yield from line_blocks(self._head, size)
        if hasattr(self._rest, "blocks"):
            yield from self._rest.blocks(size)  # numbers on from the head, as numbered()
        else:
            head = len(self._head)
            yield from ((n + head, text) for n, text in line_blocks(self._rest, size))

    def numbered(self, comments: str = "") -> Iterator[tuple[int, str]]:
        yield from numbered(self._head, comments)
        # A StrictText numbers on from the lines it handed out (the head's included).
        if hasattr(self._rest, "numbered"):
            yield from numbered(self._rest, comments)
        else:
            head = len(self._head)
            yield from ((n + head, line) for n, line in numbered(self._rest, comments))


class _Rewound:
    """A stream whose first characters were already read for detection."""

    def __init__(self, head: str, rest: TextIO):
        self._head = head
        self._rest = rest
        self.max_line = getattr(rest, "max_line", 0)

    def read(self, size: int = -1) -> str:
        if self._head:
            out = self._head if size < 0 else self._head[:size]
            self._head = self._head[len(out) :]
            return out
        return self._rest.read(size)


_JSON_SPACE = re.compile(r"[ \t\r\n,]*")


def _json_array(stream: TextIO) -> Iterator[object]:
    """The items of a top-level JSON array, decoded one at a time from a stream. An
    item cut short by the buffer's end is decoded again only once the buffer holds
    twice as much of it (linear, not a decode per 64 KiB); an item longer than the
    stream's max_line, or nested too deep to decode, fails the body."""
    decoder = json.JSONDecoder()
    max_item = int(getattr(stream, "max_line", 0) or 0)
    buffer = ""
    position = 0
    eof = False

    def fill() -> bool:
        nonlocal buffer, position, eof
        if eof:
            return False
        data = stream.read(_JSON_READ)
        if not data:
            eof = True
            return False
        buffer = buffer[position:] + data
        position = 0
        return True

    def skip_space() -> None:
        nonlocal position
        while True:
            position = _JSON_SPACE.match(buffer, position).end()  # type: ignore[union-attr]
            if position < len(buffer) or not fill():
                return

    skip_space()
    if position >= len(buffer) or buffer[position] != "[":
        raise FeedError("not a JSON array: wrong content for the phishtank-json format")
    position += 1
    count = 0
    while True:
        skip_space()
        if position >= len(buffer):
            raise FeedError("the JSON array is truncated (no closing ']')")
        if buffer[position] == "]":
            return
        count += 1
        tried = 0
        while True:
            if len(buffer) - position < 2 * tried and fill():
                continue
            tried = len(buffer) - position
            try:
                item, end = decoder.raw_decode(buffer, position)
            except json.JSONDecodeError as exc:
                if max_item and tried > max_item:
                    raise _json_too_long(count, max_item) from exc
                if fill():
                    continue
                raise FeedError(f"the JSON body is truncated or malformed: {exc}") from exc
            except RecursionError as exc:
                raise FeedError(
                    f"item {count:,} of the JSON array is nested too deeply to read: refused"
                ) from exc
            # An item that ends exactly at the buffer's end may be a number cut short.
            if end == len(buffer) and fill():
                continue
            break
        if max_item and end - position > max_item:
            raise _json_too_long(count, max_item)
        position = end
        yield item


def _json_too_long(count: int, max_item: int) -> FeedError:
    return FeedError(
        f"item {count:,} of the JSON array is longer than {max_item:,} characters "
        "(FEED_MAX_LINE): the body is refused"
    )
