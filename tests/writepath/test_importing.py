"""urlguard.writepath.importing.parse_rules: plain lists, hosts files and CSV, detected from
the file; refusals with reasons; duplicates reported; line numbers kept."""

from __future__ import annotations

import io

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from urlguard.writepath.importing import parse_rules
from urlguard.writepath.rulelists import ParsedLine


def parse(text: str, default_category: str = "spam") -> list[ParsedLine]:
    return list(parse_rules(io.StringIO(text), default_category=default_category))


def summary(lines: list[ParsedLine]) -> list[tuple]:
    return [
        (p.lineno, p.expression, p.category, p.error is not None, p.duplicate_of) for p in lines
    ]


def test_plain_list():
    lines = parse(
        "# spam feed, 2026-11-22\n"
        "\n"
        "evil.example.com\n"
        "https://Phish.example.org/login.html?x=1#frag\n"
        "   ! an adblock-style comment\n"
        "*.tracker.example.net   # inline comment\n"
        "||ads.example.net^\n"
        "http://example.com/path/to/page.html\n"
        "||track.example.net^$third-party,image\n"
        "||example.org/banner/^\n"
    )
    assert summary(lines) == [
        (3, "evil.example.com/", "spam", False, None),
        (4, "phish.example.org/login.html?x=1", "spam", False, None),
        (6, "tracker.example.net/", "spam", False, None),
        (7, "ads.example.net/", "spam", False, None),
        (8, "example.com/path/to/page.html", "spam", False, None),
        (9, "track.example.net/", "spam", False, None),
        (10, "example.org/banner/", "spam", False, None),
    ]
    assert lines[1].raw == "https://Phish.example.org/login.html?x=1#frag"
    assert all(p.is_new for p in lines)


def test_refusals_carry_the_reason():
    lines = parse("com\nco.uk\nmailto:x@example.com\ntwo words\n/only/a/path\nok.example\n")
    assert [(p.lineno, p.expression is None) for p in lines] == [
        (1, True),
        (2, True),
        (3, True),
        (4, True),
        (5, True),
        (6, False),
    ]
    assert "top-level domain" in lines[0].error
    assert "public suffix" in lines[1].error
    assert "only http and https" in lines[2].error
    assert "one URL or host" in lines[3].error
    assert "no host" in lines[4].error
    assert lines[5].error is None


def test_duplicates_are_reported():
    lines = parse("evil.example.com\nhttp://EVIL.example.com/\nother.example\nevil.example.com/\n")
    assert [(p.lineno, p.duplicate_of, p.error) for p in lines] == [
        (1, None, None),
        (2, 1, None),
        (3, None, None),
        (4, 1, None),
    ]
    assert [p.is_new for p in lines] == [True, False, True, False]


def test_hosts_file():
    lines = parse(
        "# StevenBlack-style hosts file\n"
        "127.0.0.1 localhost\n"
        "127.0.0.1 localhost.localdomain\n"
        "255.255.255.255 broadcasthost\n"
        "::1 localhost ip6-localhost ip6-loopback\n"
        "fe80::1%lo0 localhost\n"
        "0.0.0.0 0.0.0.0\n"
        "0.0.0.0 ads.example.com\n"
        "0.0.0.0\tmalware.example.net   track.example.org  # tail comment.example\n"
        "127.0.0.1 Phish.EXAMPLE.org.\n",
        default_category="malware",
    )
    assert summary(lines) == [
        (8, "ads.example.com/", "malware", False, None),
        (9, "malware.example.net/", "malware", False, None),
        (9, "track.example.org/", "malware", False, None),
        (10, "phish.example.org/", "malware", False, None),
    ]
    assert lines[1].raw == (
        "0.0.0.0\tmalware.example.net   track.example.org  # tail comment.example"
    )


def test_hosts_file_entries_are_refused_like_any_other():
    lines = parse("0.0.0.0 com\n0.0.0.0 good.example\n")
    assert lines[0].error and "top-level domain" in lines[0].error
    assert lines[1].expression == "good.example/"


def test_csv_with_category_and_note():
    lines = parse(
        "\ufeffURL,Category,Note\n"
        "http://x.example.com/a,phishing,seen in mail\n"
        '"http://y.example.com/b,c",Malware,\n'
        "z.example.com,,defaults\n"
        "w.example.com,Unwanted software,label instead of value\n"
        "v.example.com\n"
        "\n"
        "# a comment row\n"
        'u.example.com,other,"a note\n'
        'on two lines"\n'
        "t.example.com,phishing,after the multi-line row\n",
        default_category="spam",
    )
    assert summary(lines) == [
        (2, "x.example.com/a", "phishing", False, None),
        (3, "y.example.com/b,c", "malware", False, None),
        (4, "z.example.com/", "spam", False, None),
        (5, "w.example.com/", "unwanted", False, None),
        (6, "v.example.com/", "spam", False, None),
        (9, "u.example.com/", "other", False, None),
        (11, "t.example.com/", "phishing", False, None),
    ]
    assert lines[0].note == "seen in mail"
    assert lines[5].note == "a note\non two lines"
    assert lines[5].raw == 'u.example.com,other,"a note\non two lines"'


def test_csv_errors_per_line():
    lines = parse(
        "expression;category\n"
        "a.example.com/;bogus\n"
        ";spam\n"
        "co.uk;spam\n"
        "b.example.com/;SPAM\n"
        "a.example.com/;phishing\n"
    )
    assert summary(lines) == [
        (2, None, "spam", True, None),
        (3, None, "spam", True, None),
        (4, None, "spam", True, None),
        (5, "b.example.com/", "spam", False, None),
        (6, "a.example.com/", "phishing", False, None),  # line 2 was refused: not a repeat
    ]
    assert "unknown category 'bogus'" in lines[0].error
    assert "phishing" in lines[0].error  # names the choices
    assert "column is empty" in lines[1].error
    assert "public suffix" in lines[2].error


@pytest.mark.parametrize("header", ["host", "Domain\tCategory", "category|url", '"url"'])
def test_csv_header_variants(header):
    delimiter = "\t" if "\t" in header else "|" if "|" in header else ","
    row = (
        ("phishing" + delimiter + "evil.example")
        if header.startswith("category")
        else ("evil.example" + (delimiter + "phishing" if delimiter != "," else ""))
    )
    lines = parse(f"{header}\n{row}\n")
    assert [p.expression for p in lines] == ["evil.example/"]


def test_a_url_with_a_comma_is_not_csv():
    lines = parse("https://example.com/a?x=1,2\n")
    assert [p.expression for p in lines] == ["example.com/a?x=1,2"]


def test_empty_and_comment_only_files():
    assert parse("") == []
    assert parse("# nothing here\n\n   \n! nor here\n") == []


def test_lines_without_endings_and_crlf():
    lines = list(parse_rules(["a.example", "b.example\r\n", "  "], default_category="spam"))
    assert [(p.lineno, p.expression) for p in lines] == [(1, "a.example/"), (2, "b.example/")]


def test_unknown_default_category_is_a_caller_error():
    with pytest.raises(ValueError, match="unknown default category"):
        list(parse_rules(["a.example"], default_category="nonsense"))


def test_is_lazy_and_handles_a_large_file():
    # Parsed as a stream: the first entry comes out after reading one line, and a
    # large hosts file yields one entry per line.
    consumed = 0

    def lines():
        nonlocal consumed
        for i in range(30_000):
            consumed += 1
            yield f"0.0.0.0 host{i}.example.com\n"

    parsed = parse_rules(lines(), default_category="spam")
    first = next(parsed)
    assert (first.lineno, first.expression, consumed) == (1, "host0.example.com/", 1)
    rest = list(parsed)
    assert len(rest) == 29_999 and consumed == 30_000
    assert all(p.is_new for p in rest)
    assert rest[-1].expression == "host29999.example.com/"


@settings(max_examples=300, deadline=None)
@example(["\n|"])  # a newline inside a "line": once crashed the CSV header sniffing
@given(
    st.lists(
        st.one_of(
            st.text(max_size=40),
            st.sampled_from(
                [
                    "url,category",
                    "0.0.0.0 a.example b.example",
                    "# c",
                    "",
                    "x.example",
                    '"unterminated,quote',
                    "||y.example^",
                    "evil.example,phishing",
                    "\x00",
                    "a;b;c",
                    "com",
                ]
            ),
        ),
        max_size=12,
    )
)
def test_any_upload_parses_without_crashing(lines):
    for parsed in parse_rules(lines, default_category="spam"):
        assert 1 <= parsed.lineno <= len(lines)
        assert (parsed.expression is None) == (parsed.error is not None)
        assert parsed.category in ("phishing", "malware", "spam", "unwanted", "other")


def test_a_csv_row_short_of_the_url_column_says_so():
    [line] = parse("category,url\nevil.example\n")
    assert line.expression is None
    assert "1 column(s)" in line.error and "'url' column is column 2" in line.error
    assert "category" not in line.error, "the host is not reported as an unknown category"


def test_the_block_fast_path_parses_as_each_line_alone(monkeypatch):
    """A plain list's one-URL lines go through plain_expressions a block at a time;
    what comes out is what normalize_rule makes of each line on its own."""
    from urlguard.writepath import importing

    kinds = [
        "host{i}.example.com",
        "http://Host{i}.Example.com/a/b.html",
        "https://host{i}.example.com/path/",
        "*.wild{i}.example.com",
        "||abp{i}.example^",
        "co.uk",
        "-bad{i}.example",
        "xn--bcher-kva{i}.example",
        "a{i}.example/x?q=1",
        "two{i}.example three.example",
        "0.0.0.0 hosts{i}.example localhost",
        "# comment {i}",
        "",
        "host{i}.example.com  # trailing comment",
        "http://[::1]/x{i}",
        "dup.example",
    ]
    lines = [kinds[i % len(kinds)].format(i=i) for i in range(3 * 4096 + 17)]
    fast = list(parse_rules(lines, default_category="malware"))
    monkeypatch.setattr(importing, "plain_expressions", lambda texts: [None] * len(texts))
    assert fast == list(parse_rules(lines, default_category="malware"))
    assert sum(p.expression is not None for p in fast) > len(lines) // 2
