"""A fetched body as text lines: gzip and zip bodies are opened as streams (never read
whole), the text must be UTF-8, and a body that is cut short, undecodable or an HTML
page where a list was expected is a FeedError, so that it can never look like a feed
that shrank."""

from __future__ import annotations

import codecs
import gzip
import io
import zipfile
import zlib
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import BinaryIO

__all__ = ["FeedError", "open_text"]

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

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def,override]
        try:
            data = self._raw.read(len(buffer))
        except EOFError as exc:
            raise FeedError(f"the {self._what} body is truncated ({exc})") from exc
        except (OSError, zlib.error, zipfile.BadZipFile) as exc:
            raise FeedError(f"the {self._what} body is corrupt ({exc})") from exc
        self.count += len(data)
        if self.count > self._limit:
            raise FeedError(
                f"the {self._what} body expands past {self._limit:,} bytes "
                "(FEED_MAX_BYTES): refused"
            )
        buffer[: len(data)] = data
        return len(data)


@contextmanager
def open_text(body: BinaryIO, *, limit: int) -> Iterator[io.TextIOBase]:
    """`body` (a seekable binary file) as a UTF-8 text stream, decompressed if it is
    gzip or a zip archive of one file. Reading it raises FeedError for a truncated or
    corrupt archive, bytes that are not UTF-8, or more than `limit` bytes of text."""
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
    text = _StrictText(io.BufferedReader(limited, _READ))
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
    return archive.open(files[0])  # type: ignore[return-value]


class _StrictText(io.TextIOBase):
    """Line-by-line UTF-8 text (a BOM dropped) whose decoding error names the byte
    offset instead of a bare UnicodeDecodeError; `read(n)` for the JSON reader."""

    def __init__(self, binary: io.BufferedReader):
        self._binary = binary
        self._decoder = codecs.getincrementaldecoder("utf-8-sig")("strict")
        self._offset = 0
        self._pending = ""  # decoded text after the last whole line
        self._ready: deque[str] = deque()  # whole lines not handed out yet

    def readable(self) -> bool:
        return True

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

    def read(self, size: int | None = -1) -> str:
        size = -1 if size is None else size
        if self._ready:
            self._pending = "".join(self._ready) + self._pending
            self._ready.clear()
        while size < 0 or len(self._pending) < size:
            data = self._binary.read(_READ)
            if not data:
                self._pending += self._decode(b"", final=True)
                break
            self._pending += self._decode(data)
        if size < 0:
            out, self._pending = self._pending, ""
        else:
            out, self._pending = self._pending[:size], self._pending[size:]
        return out

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]
        # Decoded and split a block at a time (a million lines in well under a second;
        # a line at a time costs several). The lines not yet handed out are kept here,
        # not in the generator: format detection reads the first lines and stops, and
        # the parser's iteration goes on from there.
        ready = self._ready
        while True:
            while ready:
                yield ready.popleft()
            if not self._fill():
                return

    def _fill(self) -> bool:
        """Decode the next block into whole lines; False at the end of the body."""
        while True:
            data = self._binary.read(_READ)
            if not data:
                tail = self._pending + self._decode(b"", final=True)
                self._pending = ""
                if tail:
                    self._ready.append(tail)
                return bool(tail)
            text = self._pending + self._decode(data)
            # Lines end at "\n" only, as the binary file's lines do (str.splitlines
            # would also split at \r, \x0b, \x1c, \u2028 and more).
            cut = text.rfind("\n") + 1
            self._pending = text[cut:]
            if cut:
                self._ready.extend(line + "\n" for line in text[: cut - 1].split("\n"))
                return True
