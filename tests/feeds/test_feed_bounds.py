"""Every feed input bounded in memory and time, and every way a body can break a
refresh recorded: blank lines cost nothing, an over-long line or JSON item is
refused in linear time, a refresh lists at most FEED_MAX_ENTRIES, deep JSON and zip
members that cannot be read are failed refreshes with their reason, a memo that
cannot be saved is only a warning, and an admin job never stays "running".

Memory is measured with tracemalloc (what Python allocates during the refresh) and
time as CPU time (process_time), never by sleeping."""

from __future__ import annotations

import gzip
import io
import json
import time
import tracemalloc
import zipfile
from contextlib import contextmanager

import pytest
from django.urls import reverse
from hypothesis import example, given
from hypothesis import strategies as st

from urlguard.feeds import decoding, formats, memo
from urlguard.feeds.decoding import FeedError, open_text
from urlguard.feeds.refresh import refresh_source
from urlguard.models import AdminJob, RuleSource, Source

MIB = 1 << 20


@pytest.fixture(autouse=True)
def _quiet(quiet):
    """Rule writes send no nudge."""


@pytest.fixture
def feed_file(tmp_path, settings, db):
    """make(body, **fields) -> a feed reading `body` from a file beneath FEED_FILE_ROOT."""
    settings.URLGUARD = {**settings.URLGUARD, "FEED_FILE_ROOT": str(tmp_path)}
    made = 0

    def make(body: bytes, **fields) -> Source:
        nonlocal made
        made += 1
        path = tmp_path / f"feed-{made}"
        path.write_bytes(body)
        return Source.objects.create(
            name=f"feed-{made}", kind=Source.Kind.FEED, url=f"file://{path}", **fields
        )

    return make


@contextmanager
def measured():
    """Yields a dict that holds, afterwards, the peak bytes Python allocated and the
    CPU seconds spent inside the block."""
    figures: dict[str, float] = {}
    tracemalloc.start()
    started = time.process_time()
    try:
        yield figures
    finally:
        figures["cpu"] = time.process_time() - started
        figures["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()


def zipped(data: bytes, name: str = "list.txt") -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, data)
    return out.getvalue()


def listed(source: Source) -> set[str]:
    return set(RuleSource.objects.filter(source=source).values_list("rule__expression", flat=True))


# -- reading lines --------------------------------------------------------------------


def naive_lines(text: str, max_line: int) -> list[str]:
    pieces = text.split("\n")
    lines = [piece + "\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
    if max_line:
        lines = [
            line
            if len(line.rstrip("\n")) <= max_line
            else line[: max_line + 1] + "\n" * (line.endswith("\n"))
            for line in lines
        ]
    return lines


def strict(text: str, max_line: int = 0, block_size: int = 7) -> decoding.StrictText:
    binary = io.BufferedReader(io.BytesIO(text.encode()), 16)  # type: ignore[arg-type]
    return decoding.StrictText(binary, max_line=max_line, block_size=block_size)


@given(
    st.text(alphabet=" \t\r\nab#é", max_size=300),
    st.sampled_from([0, 5, 12]),
    st.integers(1, 40),
    st.sampled_from(["", "#"]),
)
@example("ab\n\n  \nb", 0, 7, "")
@example("||a^\n||b^\n", 0, 64, "")  # a line that starts where the last one ended
@example("aaaaaaaaaaaaaaaaaaaaaa\nb\n", 5, 3, "")  # cut, then dropped across blocks
@example("  # c\n\t#\na#b\n", 0, 4, "#")
def test_lines_and_numbered_lines_agree_with_a_plain_split(text, max_line, block_size, comments):
    expected = naive_lines(text, max_line)
    assert list(strict(text, max_line, block_size)) == expected
    significant = [
        (n, line)
        for n, line in enumerate(expected, 1)
        if line.strip() and not (comments and line.lstrip()[0] in comments)
    ]
    assert list(strict(text, max_line, block_size).numbered(comments)) == significant


def test_numbered_lines_go_on_from_the_lines_detection_read():
    text = "".join(f"{'' if i % 3 else 'h'}{i}.example\n" for i in range(1000))
    stream = strict(text, block_size=50)
    fmt, lines = formats.sniff(stream, "auto")  # reads the first 200 lines
    expected = [(n, line) for n, line in enumerate(naive_lines(text, 0), 1) if line.strip()]
    assert fmt == "urls" and list(decoding.numbered(lines)) == expected


def test_sixteen_mib_of_zipped_newlines_cost_neither_memory_nor_time(feed_file):
    body = zipped(b"\n" * (16 * MIB) + b"a.example\n" + b"#comment\n" * MIB)
    source = feed_file(body)
    with measured() as figures:
        result = refresh_source(source)
    assert result.status == "ok" and listed(source) == {"a.example/"}, result.error
    # Before: 629 MB and 20 s (three int64s and a Python call per blank line).
    assert figures["peak"] < 8 * MIB, figures
    assert figures["cpu"] < 10, figures


def test_a_line_past_the_limit_is_refused_in_linear_time(feed_file, settings):
    settings.URLGUARD = {**settings.URLGUARD, "FEED_MAX_LINE": 4096}
    body = gzip.compress(b"x" * (32 * MIB) + b"\na.example\n")
    source = feed_file(body)
    with measured() as figures:
        result = refresh_source(source)
    assert result.status == "ok" and listed(source) == {"a.example/"}
    assert result.refused == 1 and "FEED_MAX_LINE" in result.refusals[0][2]
    assert result.refusals[0][0] == 1
    # Before: the pending line was copied and rescanned per 64 KiB block (quadratic:
    # 17.8 s for 64 MiB) and held whole.
    assert figures["peak"] < 8 * MIB, figures


def test_a_json_item_past_the_limit_fails_the_body_without_reading_it_all(feed_file, settings):
    settings.URLGUARD = {**settings.URLGUARD, "FEED_MAX_LINE": 4096}
    item = json.dumps({"phish_id": 1, "url": "http://a.example/" + "x" * (32 * MIB)})
    source = feed_file(gzip.compress(f"[{item}]".encode()), format="phishtank-json")
    with measured() as figures:
        result = refresh_source(source)
    assert result.status == "failed" and "FEED_MAX_LINE" in result.error
    # Before: decoded again from its start after every 64 KiB (15 s for 32 MiB).
    assert figures["peak"] < 8 * MIB, figures


def test_json_items_split_across_many_reads_decode_in_linear_time(monkeypatch):
    # Without a limit an item is decoded again only once the buffer has doubled.
    calls = []
    real = json.JSONDecoder.raw_decode

    def counting(self, text, index=0):
        calls.append(len(text) - index)
        return real(self, text, index)

    monkeypatch.setattr(json.JSONDecoder, "raw_decode", counting)
    monkeypatch.setattr(formats, "_JSON_READ", 64)
    item = json.dumps({"phish_id": 1, "url": "http://a.example/" + "x" * 100_000})
    items = list(formats._json_array(io.StringIO(f"[{item}]")))
    assert len(items) == 1 and len(calls) < 20 and sum(calls) < 4 * len(item)


def test_more_entries_than_the_cap_fail_the_refresh(feed_file, settings):
    settings.URLGUARD = {**settings.URLGUARD, "FEED_MAX_ENTRIES": 5}
    source = feed_file(b"".join(b"h%d.example\n" % i for i in range(6)))
    result = refresh_source(source)
    assert result.status == "failed" and "FEED_MAX_ENTRIES" in result.error
    assert not listed(source)
    source = feed_file(b"".join(b"h%d.example\n\n# c\n" % i for i in range(5)))
    assert refresh_source(source).added == 5


# -- every error is a recorded failed refresh -----------------------------------------


def patched_zip(local_offset: int, central_offset: int, value: int) -> bytes:
    """A one-file zip with a 2-byte field of both its headers set to `value`."""
    data = bytearray(zipped(b"a.example\n"))
    for signature, offset in ((b"PK\x03\x04", local_offset), (b"PK\x01\x02", central_offset)):
        at = data.index(signature) + offset
        data[at : at + 2] = value.to_bytes(2, "little")
    return bytes(data)


def encrypted_zip() -> bytes:
    return patched_zip(6, 8, 0x1)  # general purpose flag bit 0: encrypted


def deflate64_zip() -> bytes:
    return patched_zip(8, 10, 9)  # compression method 9: deflate64


@pytest.mark.parametrize(
    ("body", "fmt", "match"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "phishtank-json", "nested too deeply"),
        (b'[{"phish_id": 1, "url": ' + b"[" * 100_000, "phishtank-json", "nested too deeply"),
        (encrypted_zip(), "auto", "encrypted"),
        (deflate64_zip(), "auto", "cannot be read"),
    ],
    ids=["nested-json", "nested-json-item", "encrypted-zip", "deflate64-zip"],
)
def test_a_body_the_parser_cannot_read_is_a_recorded_failure(feed_file, body, fmt, match):
    source = feed_file(body, format=fmt)
    result = refresh_source(source)
    assert result.status == "failed" and match in result.error, result.error
    source.refresh_from_db()
    assert (source.last_status, source.failures) == ("failed", 1)
    assert match in source.last_error and source.refreshing_since is None


def test_an_unexpected_error_is_recorded_so_the_source_turns_unhealthy(feed_file, monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("a bug somewhere")

    monkeypatch.setattr(formats, "sniff", broken)
    source = feed_file(b"a.example\n")
    for _ in range(3):
        source.last_modified = ""
        source.save()
        assert refresh_source(source).status == "failed"
    source.refresh_from_db()
    assert source.failures == 3 and "ValueError: a bug somewhere" in source.last_error
    from urlguard.feeds.health import health

    assert health(source) != "ok"


def test_a_memo_that_cannot_be_saved_is_a_warning_and_the_refresh_applies(
    feed_file, monkeypatch, caplog
):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(memo, "save", full)
    source = feed_file(b"a.example\nb.example\n")
    result = refresh_source(source)
    assert result.status == "ok" and listed(source) == {"a.example/", "b.example/"}
    warnings = [r for r in caplog.records if r.levelname == "WARNING" and "memo" in r.message]
    assert warnings and "No space left on device" in warnings[0].getMessage()


def test_an_admin_refresh_of_a_body_that_breaks_the_parser_ends_failed(
    make_staff, feed_file, committed
):
    source = feed_file(b"[" * 100_000, format="phishtank-json")
    client = make_staff(superuser=True)
    with committed():
        response = client.post(reverse("admin:urlguard_source_refresh", args=[source.pk]))
    assert response.status_code == 302
    page = client.get(response["Location"])
    assert page.status_code == 200
    job = AdminJob.objects.get(kind="refresh")
    assert job.state == "failed" and "nested too deeply" in job.message


def test_open_text_cuts_and_numbers_a_real_gzip_body():
    body = gzip.compress(b"a\n" + b"y" * 5000 + b"\n\n\nb\n")
    with open_text(io.BytesIO(body), limit=MIB, max_line=1024) as text:
        assert list(text.numbered()) == [(1, "a\n"), (2, "y" * 1025 + "\n"), (5, "b\n")]
    flood = io.BytesIO(gzip.compress(b"\n" * 5000))
    with pytest.raises(FeedError, match="expands past"), open_text(flood, limit=1000) as text:
        list(text.numbered())
