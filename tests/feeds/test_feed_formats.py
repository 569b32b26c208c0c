"""urlguard.feeds.formats and decoding: every format read from a fixture as its
publisher ships it (comments, headers, quoting), bad lines refused with reasons,
detection, and compressed or broken bodies."""

from __future__ import annotations

import gzip
import io
import json
import zipfile

import pytest

from tests.support.feedserver import fixture
from urlguard.feeds.decoding import FeedError, open_text
from urlguard.feeds.formats import detect, parse


def read(body: bytes, fmt: str = "auto", category: str = "spam"):
    with open_text(io.BytesIO(body), limit=10**8) as text:
        found, entries = parse(text, fmt, category)
        return found, list(entries)


def accepted(entries):
    return [(e.expression, e.category) for e in entries if e.error is None]


def refused(entries):
    return {e.lineno: e.error for e in entries if e.error is not None}


def test_plain_url_list():
    fmt, entries = read(fixture("openphish.txt"))
    assert fmt == "urls"
    assert accepted(entries)[:3] == [
        ("secure-login.paypa1-verify.example/signin/", "spam"),
        ("wallet-connect-claim.example/claim?id=8812", "spam"),
        ("office365-mailbox-update.example.net/owa/auth.php", "spam"),
    ]
    assert ("sites.google.com/view/account-recovery-help-desk", "spam") in accepted(entries)
    assert ("xn--pypal-4ve.example/webapps/", "spam") in accepted(entries)
    assert "one URL per line" in refused(entries)[10]
    assert 7 not in {e.lineno for e in entries}  # the comment


def test_hosts_file_ignores_the_machines_own_names():
    fmt, entries = read(fixture("hosts.txt"))
    assert fmt == "hosts"
    assert accepted(entries) == [
        ("ads.tracker-network.example/", "spam"),
        ("malware-drop.example/", "spam"),
        ("malware-cdn.example/", "spam"),
        ("cryptominer.example.org/", "spam"),
        ("stealer-panel.example.net/", "spam"),
    ]
    reasons = refused(entries)
    assert "top-level domain" in reasons[15]
    assert "no host name" in reasons[16]


def test_adblock_domain_rules_and_refusals_with_reasons():
    fmt, entries = read(fixture("adblock.txt"))
    assert fmt == "adblock"
    assert [e for e, _ in accepted(entries)] == [
        "login-microsoftonline.example/",
        "fake-bank.example.co.uk/",
        "phish.shared-hosting.example/",
    ]
    reasons = refused(entries)
    assert "options ($third-party)" in reasons[10]
    assert "exception rule" in reasons[11]
    assert "cosmetic" in reasons[12]
    assert "not a domain rule" in reasons[13]  # ||host without ^ matches any prefix
    assert "not a domain rule" in reasons[14]
    assert 15 in reasons
    assert min(reasons) == 10  # header and ! comments yield nothing


def test_urlhaus_csv_dump():
    fmt, entries = read(fixture("urlhaus.csv"), category="spam")
    assert fmt == "urlhaus-csv"
    rules = accepted(entries)
    assert {c for _, c in rules} == {"malware"}
    assert [e for e, _ in rules][:4] == [
        "115.55.236.150/i",
        "raw.githubusercontent.com/evil-user/payloads/main/loader.ps1",
        "dl.malware-cdn.example/bins/sora.x86",
        "drive.google.com/uc?export=download&id=1AbCdEf",
    ]
    assert "[2001:db8::7]/x.sh" in [e for e, _ in rules]
    assert "no URL" in refused(entries)[15]
    # Doubled quotes inside a quoted field are one quote of the URL.
    assert [e for e in entries if e.lineno == 16][0].expression.startswith("evil.example/a%20")


def test_urlhaus_without_its_header_is_refused_whole():
    body = b'# some comment\n"1","2026-01-01","http://x.example/a","online"\n'
    with pytest.raises(FeedError, match="no '# id,dateadded,url"):
        read(body, "urlhaus-csv")


@pytest.mark.parametrize("name", ["phishtank.csv", "phishtank.json"])
def test_phishtank_csv_and_json(name):
    fmt, entries = read(fixture(name))
    assert fmt == ("phishtank-json" if name.endswith("json") else "phishtank-csv")
    rules = accepted(entries)
    assert rules[:2] == [
        ("signin-amazon-account.example/ap/signin", "phishing"),
        ("bank-secure.example/login?session=1,2", "phishing"),
    ]
    assert refused(entries)[3 if name.endswith("json") else 4] == "not verified by PhishTank"
    if name.endswith("json"):
        assert rules[2][0].startswith("xn--")  # IDNA
        assert refused(entries)[5] == "an array item that is not an object"
    else:
        assert "top-level domain" in refused(entries)[5]


def test_json_read_in_small_pieces_gives_the_same_items(monkeypatch):
    from urlguard.feeds import formats

    whole = read(fixture("phishtank.json"))[1]
    monkeypatch.setattr(formats, "_JSON_READ", 7)
    assert [(e.lineno, e.expression) for e in read(fixture("phishtank.json"))[1]] == [
        (e.lineno, e.expression) for e in whole
    ]


def test_truncated_json_is_an_error():
    body = fixture("phishtank.json")[:-40]
    with pytest.raises(FeedError, match="truncated"):
        read(body, "phishtank-json")


@pytest.mark.parametrize(
    "name", ["openphish.txt", "hosts.txt", "adblock.txt", "urlhaus.csv", "phishtank.csv"]
)
def test_gzip_and_zip_bodies_read_like_plain_ones(name):
    plain = read(fixture(name))
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, fixture(name))
    assert read(gzip.compress(fixture(name))) == plain
    assert read(zipped.getvalue()) == plain


def test_truncated_gzip_is_an_error():
    body = gzip.compress(fixture("urlhaus.csv") * 20)
    with pytest.raises(FeedError, match="truncated"):
        read(body[: len(body) // 2])


def test_corrupt_and_many_file_zips_are_errors():
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("a.txt", "a.example\n")
        archive.writestr("b.txt", "b.example\n")
    with pytest.raises(FeedError, match="one file"):
        read(zipped.getvalue())
    with pytest.raises(FeedError, match="zip"):
        read(zipped.getvalue()[:30])


def test_a_body_that_expands_past_the_limit_is_refused():
    bomb = gzip.compress(b"a.example\n" * 100_000)
    with (
        pytest.raises(FeedError, match="FEED_MAX_BYTES"),
        open_text(io.BytesIO(bomb), limit=10_000) as text,
    ):
        list(text)


def test_wrong_content_is_an_error():
    with pytest.raises(FeedError, match="not UTF-8"):
        read(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4)
    with pytest.raises(FeedError, match="HTML"):
        read(b"<!DOCTYPE html><html><body>Service unavailable</body></html>\n")


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (["phish_id,url,phish_detail_url\n"], "phishtank-csv"),
        (['[{"phish_id":"1"}]'], "phishtank-json"),
        (["# id,dateadded,url,url_status,last_online\n"], "urlhaus-csv"),
        (["[Adblock Plus 2.0]\n"], "adblock"),
        (["! comment\n", "||a.example^\n"], "adblock"),
        (["# c\n", "0.0.0.0 a.example\n"], "hosts"),
        (["# c\n", "https://a.example/x\n"], "urls"),
        ([], "urls"),
    ],
)
def test_detect(head, expected):
    assert detect(head) == expected


def test_a_utf8_bom_is_dropped():
    assert accepted(read(b"\xef\xbb\xbfa.example\n")[1]) == [("a.example/", "spam")]


@pytest.mark.parametrize("crlf", [False, True])
def test_detection_then_parsing_loses_no_line_of_a_long_body(crlf):
    # Detection reads the first lines and stops; the parser goes on from there, past
    # many blocks of decoding, with no line lost, cut or joined at a block's edge.
    end = "\r\n" if crlf else "\n"
    hosts = [f"host-{i}.example{'é' * (i % 3)}" for i in range(20_000)]
    body = ("# a long list" + end + end.join(hosts) + end).encode()
    assert len(body) > 6 * 65536
    fmt, entries = read(body)
    assert fmt == "urls" and not refused(entries)
    assert len(entries) == len(hosts)
    assert [e.lineno for e in entries] == list(range(2, len(hosts) + 2))
    assert [e.raw for e in entries] == hosts


def test_json_detected_then_read_whole_past_many_blocks():
    items = [
        {"phish_id": i, "url": f"https://phish-{i}.example/login", "verified": "yes"}
        for i in range(5_000)
    ]
    body = ("[\n" + ",\n".join(json.dumps(item) for item in items) + "\n]\n").encode()
    assert len(body) > 4 * 65536
    fmt, entries = read(body)
    assert fmt == "phishtank-json" and len(accepted(entries)) == 5_000


def test_separators_other_than_newline_stay_inside_a_line():
    fmt, entries = read("a.example\u2028b\n\x1cc.example\rd\n".encode())
    assert [e.raw for e in entries] == ["a.example\u2028b", "\x1cc.example\rd"]


@pytest.mark.parametrize("fmt", ["urls", "hosts", "adblock"])
@pytest.mark.parametrize(
    "line",
    [
        "http://evil.example/x\n",
        "  evil.example  \r\n",
        "\n",
        "   \n",
        "# a comment\n",
        "evil.example # why\n",
        "http://evil.example/#frag\n",
        "two.example three.example\n",
        "0.0.0.0 a.example b.example\n",
        "||ads.example^\n",
        "||ads.example^$third-party\n",
        "! adblock comment\n",
        "\ufeffbom.example\n",
        "tab\tseparated.example\n",
        "last.example",
    ],
)
def test_a_line_parses_alone_as_it_does_in_its_body(fmt, line):
    # The refresh parses only the lines its memo does not know, one at a time.
    from urlguard.feeds.formats import FORMATS, parse_line

    def fields(entries):
        return [(e.raw, e.expression, e.error, e.category) for e in entries]

    alone = parse_line(fmt, line, 7, "spam")
    in_body = list(FORMATS[fmt](iter([line]), "spam"))
    assert fields(alone) == fields(in_body)
    assert all(e.lineno == 7 for e in alone)
