"""A fetched body as text lines: gzip and zip bodies are opened as streams (never read
whole), the text must be UTF-8, and a body that is cut short, undecodable or an HTML
page where a list was expected is a FeedError, so that it can never look like a feed
that shrank."""

from __future__ import annotations

import codecs
import functools
import gzip
import io
import re
import zipfile
import zlib
from collections import deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import BinaryIO

__all__ = ["FeedError", "StrictText", "line_blocks", "numbered", "open_text"]

_GZIP_MAGIC = b"\x1f\x8b"
_ZIP_MAGIC = b"PK\x03\x04"
_READ = 1 << 16


class FeedError(Exception):
    """A refresh that cannot be trusted; the message is recorded on the source."""


class _Limited(io.RawIOBase):
    """A decompressed stream that stops with a FeedError past `limit` bytes (a
    small compressed body can expand without bound) and turns the decompressor's
    complaints about a cut-short or corrupt body into FeedErrors."""

    def __init__(self, raw: BinaryIO, limit: int, what: str):
        self._raw = raw
        self._limit = limit
        self._what = what
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            data = self._raw.read(len(buffer))
        except EOFError as exc:
            raise FeedError(f"the {self._what} body is truncated ({exc})") from exc
        except (OSError, zlib.error, zipfile.BadZipFile) as exc:
            raise FeedError(f"the {self._what} body is corrupt ({exc})") from exc
        except (RuntimeError, NotImplementedError) as exc:  # zipfile's refusals
            raise FeedError(f"the {self._what} body cannot be read ({exc})") from exc
        self.count += len(data)
        if self.count > self._limit:
            raise FeedError(
                f"the {self._what} body expands past {self._limit:,} bytes "
                "(FEED_MAX_BYTES): refused"
            )
        buffer[: len(data)] = data
        return len(data)


@contextmanager
def open_text(body: BinaryIO, *, limit: int, max_line: int = 0) -> Iterator[StrictText]:
    """`body` (a seekable binary file) as a UTF-8 text stream, decompressed if it is
    gzip or a zip archive of one file. Reading it raises FeedError for a truncated or
    corrupt archive, bytes that are not UTF-8, or more than `limit` bytes of text. A
    line longer than `max_line` characters (0: no limit) comes out cut to
    `max_line + 1` of them, so that the reader can refuse it by its length."""
    head = body.read(4)
    body.seek(0)
    if head.startswith(_GZIP_MAGIC):
        raw: BinaryIO = gzip.GzipFile(fileobj=body, mode="rb")  # type: ignore[assignment]
        what = "gzip"
    elif head.startswith(_ZIP_MAGIC):
        raw, what = _zip_member(body), "zip"
    else:
        raw, what = body, "feed"
    limited = _Limited(raw, limit, what)
    text = StrictText(io.BufferedReader(limited, _READ), max_line=max_line)
    try:
        yield text
    finally:
        raw.close()


def _zip_member(body: BinaryIO) -> BinaryIO:
    try:
        archive = zipfile.ZipFile(body)
    except (zipfile.BadZipFile, EOFError, OSError) as exc:
        raise FeedError(f"the zip body is truncated or corrupt ({exc})") from exc
    files = [info for info in archive.infolist() if not info.is_dir()]
    if len(files) != 1:
        names = ", ".join(info.filename for info in files[:5]) or "none"
        raise FeedError(f"a zip body must hold one file, it holds {len(files)} ({names})")
    member = files[0]
    if member.flag_bits & 0x1:
        raise FeedError(
            f"the zip member {member.filename!r} is encrypted: a feed must be readable "
            "without a password"
        )
    try:
        return archive.open(member)  # type: ignore[return-value]
    except (NotImplementedError, RuntimeError, zipfile.BadZipFile, OSError) as exc:
        # deflate64, bzip2 with a broken stream, an unknown method...
        raise FeedError(f"the zip member {member.filename!r} cannot be read ({exc})") from exc


class StrictText(io.TextIOBase):
    """Line-by-line UTF-8 text (a BOM dropped) whose decoding error names the byte
    offset instead of a bare UnicodeDecodeError; `read(n)` for the JSON reader, and
    `numbered()` for the lines that are not blank, with their line numbers.

    Every character is looked at a bounded number of times: a line that has not
    ended is kept as pieces (never re-joined and re-scanned per block), a line past
    `max_line` is cut and the rest of it dropped as it arrives, and blank lines are
    skipped a block at a time by a regular expression, not a line at a time."""

    def __init__(self, binary: io.BufferedReader, *, max_line: int = 0, block_size: int = _READ):
        self._binary = binary
        self._block_size = block_size
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")("strict")
        self._offset = 0
        self._max_line = max_line
        self._pending: list[str] = []  # the line that has not ended yet, in pieces
        self._pending_size = 0
        self._dropping = False  # inside a line cut at max_line: drop up to its end
        self._wanted: re.Pattern[str] | None = None  # ... and a character to keep of it
        self._ready: deque[str] = deque()  # whole lines not handed out yet
        self._text = ""  # read(): decoded text not handed out yet
        self.lines_read = 0  # lines handed out (blank ones included)

    def readable(self) -> bool:
        return True

    @property
    def max_line(self) -> int:
        return self._max_line

    def _decode(self, data: bytes, final: bool = False) -> str:
        try:
            text = self._decoder.decode(data, final)
        except UnicodeDecodeError as exc:
            raise FeedError(
                f"the body is not UTF-8 text (byte {self._offset + exc.start:,}): "
                "wrong content or wrong format"
            ) from exc
        self._offset += len(data)
        return text

    def _take_pending(self) -> str:
        text = "".join(self._pending)
        self._pending.clear()
        self._pending_size = 0
        return text

    def _block(self, size: int = 0, *, cut_lines: bool = True) -> str | None:
        """The next decoded text that ends at a line end (or at the body's end), each
        line in it at most max_line + 1 characters; None at the end of the body.
        `size`: the bytes to read at once (0: the stream's block size); not `cut_lines`:
        a line that lies within the block is left whole (the reader measures it)."""
        limit = self._max_line
        while True:
            data = self._binary.read(size or self._block_size)
            text = self._decode(data, final=not data)
            if self._dropping:
                cut = text.find("\n")
                end = len(text) if cut < 0 else cut
                if self._wanted and (found := self._wanted.search(text, 0, end)):
                    self._pending[-1] += found.group()
                    self._wanted = None
                text = "" if cut < 0 else text[cut:]
                self._dropping = cut < 0
                self._wanted = self._wanted if self._dropping else None
            cut = text.rfind("\n") + 1
            if cut:
                block = self._take_pending() + text[:cut]
                rest = text[cut:]
                if rest:
                    self._pending.append(rest)
                    self._pending_size = len(rest)
            else:
                self._pending.append(text)
                self._pending_size += len(text)
                block = "" if data else self._take_pending()
            # For blocks(), a line keeps one character more than max_line + 1: a
            # line's length does not count the CR of a CRLF end, and no more.
            keep = limit + 1 if cut_lines else limit + 2
            if limit and self._pending_size > keep - 1:
                joined = "".join(self._pending)
                kept = joined[:keep]
                if not cut_lines and kept.isspace():
                    # ... and a line of white space so far keeps its next character
                    # that is not (one of white space only is blank however long).
                    found = _NOT_SPACE.search(joined, keep)
                    if found is not None:
                        kept += found.group()
                    self._wanted = _NOT_SPACE if found is None else None
                self._pending[:] = [kept]
                self._pending_size = len(kept)
                self._dropping = True
            if cut_lines and limit and len(block) > limit:
                block = self._cut_long_lines(block)
            if block:
                return block
            if not data:
                return None

    def _cut_long_lines(self, block: str) -> str:
        limit = self._max_line
        lines = block.split("\n")
        return "\n".join(line if len(line) <= limit else line[: limit + 1] for line in lines)

    def read(self, size: int | None = -1) -> str:
        size = -1 if size is None else size
        if self._ready or self._pending:
            self._text = "".join(self._ready) + self._take_pending() + self._text
            self._ready.clear()
        parts = [self._text]
        have = len(self._text)
        while size < 0 or have < size:
            data = self._binary.read(self._block_size)
            text = self._decode(data, final=not data)
            parts.append(text)
            have += len(text)
            if not data:
                break
        text = "".join(parts)
        if size < 0:
            out, self._text = text, ""
        else:
            out, self._text = text[:size], text[size:]
        return out

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]
        # Decoded and split a block at a time (a million lines in well under a second;
        # a line at a time costs several). The lines not yet handed out are kept here,
        # not in the generator: format detection reads the first lines and stops, and
        # the parser's iteration goes on from there.
        ready = self._ready
        while True:
            while ready:
                self.lines_read += 1
                yield ready.popleft()
            block = self._block()
            if block is None:
                return
            # Lines end at "\n" only, as the binary file's lines do (str.splitlines
            # would also split at \r, \x0b, \x1c, \u2028 and more).
            lines = block.split("\n")
            last = lines.pop()
            ready.extend(line + "\n" for line in lines)
            if last:
                ready.append(last)

    def blocks(self, size: int = 1 << 20) -> Iterator[tuple[int, str]]:
        """(number of its first line, text) of the rest of the body a block of about
        `size` bytes at a time, each block whole lines (the last one may lack its
        line end at the body's end). A line longer than max_line + 1 is cut to
        max_line + 2 characters (3 if they are white space) only where it spans blocks
        (so a block is at most `size` bytes and one such line): the reader measures
        each line, a CR before its end not counted. Blank and
        comment lines are left in: the reader numbers and skips them."""
        if self._ready:
            first = self.lines_read + 1
            text = "".join(self._ready)
            self.lines_read += len(self._ready)
            self._ready.clear()
            yield first, text
        while (block := self._block(size, cut_lines=False)) is not None:
            first = self.lines_read + 1
            self.lines_read += block.count("\n") + (not block.endswith("\n"))
            yield first, block

    def numbered(self, comments: str = "") -> Iterator[tuple[int, str]]:
        """(line number, line) of each line that is neither blank (whitespace only)
        nor, when `comments` names characters, a comment (its first other character
        one of them): a run of such lines costs one regular-expression search."""
        ready = self._ready
        while ready:
            self.lines_read += 1
            line = ready.popleft()
            if _significant(line, comments):
                yield self.lines_read, line
        # Blank runs are crossed by the plain search (several times faster); from a
        # comment on, the line-start search crosses comments and blanks alike.
        plain, next_start = _NOT_SPACE.search, line_start(comments).search
        while (block := self._block()) is not None:
            lineno = self.lines_read
            position = 0
            while (found := plain(block, position)) is not None:
                if comments and found.group() in comments:
                    if (found := next_start(block, found.start())) is None:
                        break
                    start = found.start()
                else:
                    start = block.rfind("\n", position, found.start()) + 1 or position
                end = block.find("\n", start) + 1 or len(block)
                lineno += block.count("\n", position, start) + 1
                self.lines_read = lineno
                yield lineno, block[start:end]
                position = end
            self.lines_read = lineno + block.count("\n", position)
            if not block.endswith("\n"):
                self.lines_read += position < len(block)


_NOT_SPACE = re.compile(r"\S")


@functools.cache
def line_start(comments: str) -> re.Pattern[str]:
    """Finds the start of the next line that is not blank and not a comment."""
    return re.compile(r"^[^\S\n]*[^\s" + re.escape(comments) + "]", re.MULTILINE)


def _significant(line: str, comments: str) -> bool:
    stripped = line.lstrip()
    return bool(stripped) and not (comments and stripped[0] in comments)


def line_blocks(lines: Iterable[str], size: int = 1 << 20) -> Iterator[tuple[int, str]]:
    """(number of its first line, text) of whole lines of `lines` at a time (see
    StrictText.blocks; any other iterable of lines is joined a few at a time)."""
    blocks = getattr(lines, "blocks", None)
    if blocks is not None:
        yield from blocks(size)
        return
    first, pending, have = 1, [], 0
    for line in lines:
        if not line.endswith("\n"):
            line += "\n"  # a line of a list: each ends where the next begins
        pending.append(line)
        have += len(line)
        if have >= size:
            yield first, "".join(pending)
            first += len(pending)
            pending, have = [], 0
    if pending:
        yield first, "".join(pending)


def numbered(lines: Iterable[str], comments: str = "") -> Iterator[tuple[int, str]]:
    """(line number, line) of each line of `lines` that is not blank nor a comment
    (see StrictText.numbered); a StrictText (or a detection's head and rest) skips
    them a block at a time."""
    numbering = getattr(lines, "numbered", None)
    if numbering is not None:
        yield from numbering(comments)
        return
    for lineno, line in enumerate(lines, start=1):
        if _significant(line, comments):
            yield lineno, line
