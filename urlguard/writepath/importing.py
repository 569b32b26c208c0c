"""Reading uploaded rule lists: one URL or host per line, hosts files
("0.0.0.0 evil.example"), and CSV with a header naming a URL column and
optionally a category (and note) column. Parsing, and planning, no database: the
import_rules command and the admin import page hand what plan_import makes of the
parsed lines (a ChangePlan: its entries in a file on disk) to
urlguard.writepath.apply, which lists them in one change set (on PostgreSQL by
the bulk loader). A dry run counts through urlguard.writepath.changes.add_rules.

The format is detected from the first line that is not blank or a comment: a
header with a url/expression/host/domain column makes the file CSV; otherwise
each line is read on its own, as a hosts-file entry if it starts with an IP
address followed by names, else as one URL, host or expression (blocklist
spellings `*.example.com`, `||example.com^` and `example.com/dir/*` included).
The entry type, the normalization of an entry and the CSV row reader are
urlguard.writepath.rulelists', which the feed formats share.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import TYPE_CHECKING

from urlguard.writepath.rulelists import (
    HOSTS_FILE_SELF_NAMES,
    ParsedLine,
    csv_rows,
    entry,
    entry_text,
    is_ip_address,
    without_comment,
)
from urlguard.writepath.rules import plain_expressions

if TYPE_CHECKING:
    from urlguard.writepath.changes import Refusal
    from urlguard.writepath.plan import ChangePlan

__all__ = [
    "CSV_CATEGORY_COLUMNS",
    "CSV_NOTE_COLUMNS",
    "CSV_URL_COLUMNS",
    "PlannedImport",
    "parse_rules",
    "plan_import",
]

# Header names (case-insensitive) recognised in a CSV file, first match wins.
CSV_URL_COLUMNS = ("url", "expression", "rule", "host", "hostname", "domain", "pattern")
CSV_CATEGORY_COLUMNS = ("category", "type", "threat", "threat_type", "kind")
CSV_NOTE_COLUMNS = ("note", "notes", "comment", "description", "reason")
_CSV_DELIMITERS = (",", ";", "\t", "|")
# Lines of a plain list read at once, at most (see _line_entries).
_BLOCK = 4096


def parse_rules(lines: Iterable[str], *, default_category: str) -> Iterator[ParsedLine]:
    """Yield a ParsedLine per entry of `lines` (decoded lines of an uploaded file,
    with or without line endings), in file order; blank lines and comments yield
    nothing. `default_category` applies where the file names none; an unknown one
    raises ValueError at once (a caller's mistake, not the file's)."""
    categories = _category_lookup()
    default = (
        categories.get(default_category.strip().lower())
        if isinstance(default_category, str)
        else None
    )
    if default is None:
        raise ValueError(
            f"unknown default category {default_category!r}; use one of "
            f"{', '.join(sorted(set(categories.values())))}"
        )

    numbered = _numbered(lines)
    for lineno, text in numbered:
        if _is_blank_or_comment(text):
            continue
        header = _csv_header(text)
        rest = chain([(lineno, text)], numbered)
        if header is not None:
            entries = _csv_entries(rest, header, default, categories)
        else:
            entries = _line_entries(rest, default)
        break
    else:
        return

    seen: dict[str, int] = {}
    for parsed in entries:
        if parsed.expression is not None and parsed.error is None:
            first = seen.setdefault(parsed.expression, parsed.lineno)
            if first != parsed.lineno:
                parsed.duplicate_of = first
        yield parsed


@dataclass
class PlannedImport:
    """An import as a plan: its entries (the first line of each expression) to list
    under its label, the lines refused with their reasons, and how many lines
    repeated an expression of an earlier one."""

    plan: ChangePlan
    refusals: list[Refusal] = field(default_factory=list)
    repeated: int = 0


def plan_import(parsed: Iterable[ParsedLine], *, label: str, reason: str = "") -> PlannedImport:
    """What importing `parsed` (parse_rules' lines) under `label` writes, as data:
    read once, its entries written to a file on disk (close the plan when done)."""
    # Imported here so that parsing stays importable before Django's apps are.
    from urlguard.models import ChangeSet
    from urlguard.writepath.changes import Refusal
    from urlguard.writepath.plan import ChangePlan, Entries

    planned = PlannedImport(ChangePlan(kind=ChangeSet.Kind.IMPORT, reason=reason))

    def entries() -> Iterator[tuple[str, str, str]]:
        for line in parsed:
            if line.error is not None:
                planned.refusals.append(Refusal(line.raw or "", line.error, line.lineno))
            elif line.duplicate_of is not None:
                planned.repeated += 1
            elif line.expression is not None:
                yield line.expression, line.category, line.note or ""

    planned.plan.additions.append(Entries.of(label, entries()))
    planned.plan.refused = len(planned.refusals)
    return planned


# -- plain lists and hosts files -----------------------------------------------------


def _line_entries(numbered: Iterable[tuple[int, str]], category: str) -> Iterator[ParsedLine]:
    # Lines are read a block at a time (one, then twice as many each time, up to
    # _BLOCK): a block's one-URL lines go through plain_expressions at once, the
    # fast path of normalize_rule, and the first entry still comes after one line.
    numbered = iter(numbered)
    size = 1
    while block := list(islice(numbered, size)):
        size = min(2 * size, _BLOCK)
        split = [
            None if _is_blank_or_comment(text) else without_comment(text).split()
            for _, text in block
        ]
        texts = [entry_text(tokens[0]) for tokens in split if tokens and len(tokens) == 1]
        plain = iter(plain_expressions(texts))
        for (lineno, text), tokens in zip(block, split, strict=True):
            if tokens and len(tokens) == 1 and (expression := next(plain)) is not None:
                yield ParsedLine(lineno, text, expression, category)
            elif tokens:
                yield from _line_entry(lineno, text, tokens, category)


def _line_entry(lineno: int, text: str, tokens: list[str], category: str) -> Iterator[ParsedLine]:
    """The entries of one line, `tokens` its words without the comment."""
    if len(tokens) > 1 and is_ip_address(tokens[0]):
        # hosts file: "0.0.0.0 evil.example other.example"
        for name in tokens[1:]:
            if name.lower() in HOSTS_FILE_SELF_NAMES:
                continue
            yield entry(lineno, text, name, category)
    elif len(tokens) > 1:
        yield ParsedLine(
            lineno,
            text,
            None,
            category,
            error=f"expected one URL or host on the line, found {len(tokens)} "
            "items separated by spaces (a URL cannot contain a space: escape it "
            "as %20)",
        )
    else:
        yield entry(lineno, text, tokens[0], category)


# -- CSV -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Header:
    delimiter: str
    url: int
    category: int | None
    note: int | None
    url_name: str


def _csv_header(text: str) -> _Header | None:
    """The CSV layout if `text` is a header naming a URL column, else None."""
    for delimiter in _CSV_DELIMITERS:
        if delimiter not in text:
            continue
        try:
            cells = [cell.strip().lower() for cell in next(csv.reader([text], delimiter=delimiter))]
        except csv.Error:  # e.g. a stray newline inside the line: not a header
            continue
        url = _first_index(cells, CSV_URL_COLUMNS)
        if url is not None:
            return _Header(
                delimiter,
                url,
                _first_index(cells, CSV_CATEGORY_COLUMNS),
                _first_index(cells, CSV_NOTE_COLUMNS),
                cells[url],
            )
    name = text.strip().strip('"').strip().lower()
    if name in CSV_URL_COLUMNS:  # a one-column CSV
        return _Header(",", 0, None, None, name)
    return None


def _first_index(cells: list[str], names: tuple[str, ...]) -> int | None:
    for name in names:
        if name in cells:
            return cells.index(name)
    return None


def _csv_entries(
    numbered: Iterator[tuple[int, str]], header: _Header, default: str, categories: dict[str, str]
) -> Iterator[ParsedLine]:
    first_lineno, _ = next(numbered)  # the header itself
    return csv_rows(
        numbered,
        lambda lineno, raw, row: _csv_entry(lineno, raw, row, header, default, categories),
        delimiter=header.delimiter,
        skip_comments=True,
        category=default,
        first_lineno=first_lineno,
    )


def _csv_entry(
    lineno: int,
    raw: str,
    row: list[str],
    header: _Header,
    default: str,
    categories: dict[str, str],
) -> ParsedLine:
    if header.url >= len(row):
        # Reading its cells by the header's positions would take a URL for a
        # category (and report "unknown category"): say what is really wrong.
        return ParsedLine(
            lineno,
            raw,
            None,
            default,
            error=(
                f"{len(row)} column(s), but the {header.url_name!r} column is column "
                f"{header.url + 1}: is a {header.delimiter!r} missing?"
            ),
        )
    note = _cell(row, header.note)
    category, category_error = _row_category(_cell(row, header.category), default, categories)
    url = _cell(row, header.url)
    if category_error is not None:
        return ParsedLine(lineno, raw, None, default, error=category_error, note=note)
    if not url:
        return ParsedLine(
            lineno,
            raw,
            None,
            category,
            note=note,
            error=f"the {header.url_name!r} column is empty",
        )
    return entry(lineno, raw, url, category, note)


def _cell(row: list[str], index: int | None) -> str:
    if index is None or index >= len(row):
        return ""
    return row[index].strip()


def _row_category(cell: str, default: str, categories: dict[str, str]) -> tuple[str, str | None]:
    if not cell:
        return default, None
    category = categories.get(cell.lower())
    if category is None:
        return default, (
            f"unknown category {cell!r}; use one of {', '.join(sorted(set(categories.values())))}"
        )
    return category, None


# -- shared --------------------------------------------------------------------------


def _numbered(lines: Iterable[str]) -> Iterator[tuple[int, str]]:
    for lineno, line in enumerate(lines, start=1):
        if isinstance(line, (bytes, bytearray)):
            line = bytes(line).decode("utf-8", "replace")
        if lineno == 1:
            line = line.lstrip("\ufeff")  # a byte-order mark from a spreadsheet export
        yield lineno, line.rstrip("\r\n")


def _is_blank_or_comment(text: str) -> bool:
    stripped = text.strip()
    return not stripped or stripped.startswith(("#", "!"))


def _category_lookup() -> dict[str, str]:
    """lower-case value or label -> value, from urlguard.models.Category."""
    # Imported here so that this module stays importable before Django's apps are.
    from urlguard.models import Category

    lookup = {}
    for value, label in Category.choices:
        lookup[str(label).lower()] = value
        lookup[value.lower()] = value
    return lookup
