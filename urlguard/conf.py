"""App settings under the one URLGUARD namespace: one table (the class body of
`Settings`) gives each setting its default, type, validation, check id and hint;
the typed accessors on `conf` and the system checks (urlguard/checks.py) follow
from it. Values are read at access time, so override_settings just works."""

from __future__ import annotations

import ipaddress
import math
import re
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, Generic, TypeVar, overload

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

T = TypeVar("T")

# The values ON_FILTER_ERROR may take (the system check and Guard both refuse others).
ON_FILTER_ERROR_POLICIES = ("database", "open", "closed")

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_DNS_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")


class Setting(Generic[T]):
    """One row of the settings table. As a class attribute of `Settings` it is the
    typed accessor: reading it returns the checked, resolved value, and a value the
    system check would refuse raises ImproperlyConfigured with the check's words (so
    no caller ever sees a value of the wrong type)."""

    __slots__ = ("check_id", "default", "hint", "must_be", "name", "resolve", "valid")

    def __init__(
        self,
        default: Any,
        *,
        must_be: str,
        valid: Callable[[Any], bool],
        resolve: Callable[[Any], T],
        check_id: str,
        hint: str,
    ) -> None:
        self.name = ""
        self.default = default
        self.must_be = must_be
        self.valid = valid
        self.resolve = resolve
        self.check_id = check_id
        self.hint = hint

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def raw(self) -> Any:
        """The configured value (or the default), unchecked."""
        namespace = getattr(settings, "URLGUARD", {})
        if not isinstance(namespace, dict):
            raise ImproperlyConfigured("settings.URLGUARD must be a dict.")
        return namespace.get(self.name, self.default)

    def problem(self, value: Any) -> str:
        """ "" if `value` is acceptable, else the sentence the system check prints."""
        try:
            if self.valid(value):
                return ""
        except (TypeError, ValueError):
            pass
        return f"URLGUARD['{self.name}'] must be {self.must_be}; got {value!r}."

    def full_hint(self) -> str:
        return f"{self.hint} The default is {self.default!r}."

    @overload
    def __get__(self, obj: None, owner: type) -> Setting[T]: ...

    @overload
    def __get__(self, obj: object, owner: type) -> T: ...

    def __get__(self, obj: object | None, owner: type) -> Setting[T] | T:
        if obj is None:
            return self
        value = self.raw()
        problem = self.problem(value)
        if problem:
            raise ImproperlyConfigured(f"{problem} {self.full_hint()} ({self.check_id})")
        return self.resolve(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _text(value: Any) -> bool:
    return isinstance(value, str) and bool(value.strip())


def _names(value: Any) -> bool:
    """A list, tuple or set of non-empty strings: a bare string is refused, or "mailto"
    would be read as the letters m, a, i, l, t, o."""
    return isinstance(value, (list, tuple, set, frozenset)) and all(_text(v) for v in value)


#: The exports served at /lists/<name> (urlguard.exports.catalog; a test keeps the two
#: the same: the catalog imports this module).
EXPORT_NAMES = (
    "hosts.txt",
    "domains.txt",
    "abp.txt",
    "rspamd-domains.map",
    "rspamd-urls.map",
    "rpz.zone",
)


def _host_base_dir() -> Path | None:
    """The BASE_DIR that `django-admin startproject` writes into every settings.py (not
    a Django setting: a site may have none)."""
    base = getattr(settings, "BASE_DIR", None)
    return Path(base) if isinstance(base, (str, Path)) and str(base) else None


def _data_dir_valid(value: Any) -> bool:
    if value is None:
        return _host_base_dir() is not None
    return _text(value) or isinstance(value, Path)


def _data_dir(value: str | Path | None) -> str:
    if value is None:
        base = _host_base_dir()
        assert base is not None  # _data_dir_valid refused None without it
        return str(base / "var" / "urlguard")
    return str(value)


def _filter_path(value: str | Path | None) -> str:
    return str(Path(conf.DATA_DIR) / "filter.bin") if value is None else str(value)


def _node_name(value: str | None) -> str:
    return socket.gethostname() if value is None else value


def _schemes(value: Any) -> frozenset[str]:
    return frozenset(s.lower() for s in value)


def _host_names(value: Any) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


def _metrics_dir(value: str | Path | None) -> str:
    return str(Path(conf.DATA_DIR) / "metrics") if value is None else str(value)


def _network(value: str) -> bool:
    try:
        ipaddress.ip_network(value, strict=False)
    except ValueError:
        return False
    return True


# The widest proxy network, and how many addresses all of them may cover together, per
# IP version: a /8 (IPv4) or /32 (IPv6) is a whole private range or a provider's
# allocation, room for any proxy fleet; past that a trusted network holds clients, and
# any client in it can name its own address in X-Forwarded-For.
_PROXY_PREFIX_MIN = {4: 8, 6: 32}
_PROXY_ADDRESSES_MAX = {4: 2 * 2 ** (32 - 8), 6: 2 * 2 ** (128 - 32)}


def _proxy_network(value: str) -> bool:
    """A network of reverse proxies: no host bits set ("10.0.0.10/8" is a typo that
    would trust a whole /8), and no wider than _PROXY_PREFIX_MIN."""
    try:
        network = ipaddress.ip_network(value)
    except ValueError:
        return False
    return network.prefixlen >= _PROXY_PREFIX_MIN[network.version]


def _proxy_networks(value: Any) -> bool:
    """Proxy networks that together cover no more than _PROXY_ADDRESSES_MAX (overlaps
    counted once), so no set of narrow networks adds up to everyone."""
    if not (_names(value) and all(_proxy_network(n) for n in value)):
        return False
    networks = [ipaddress.ip_network(n) for n in value]
    v4 = [n for n in networks if isinstance(n, ipaddress.IPv4Network)]
    v6 = [n for n in networks if isinstance(n, ipaddress.IPv6Network)]
    covered = {
        4: sum(n.num_addresses for n in ipaddress.collapse_addresses(v4)),
        6: sum(n.num_addresses for n in ipaddress.collapse_addresses(v6)),
    }
    return all(covered[version] <= most for version, most in _PROXY_ADDRESSES_MAX.items())


# What the shipped examples (deploy/) and their like put where a secret belongs: a value
# that still holds one was copied, not chosen, and anyone who read the file knows it.
_PLACEHOLDER_MARKS = ("changeme", "replaceme", "placeholder", "yoursecret", "yourpassword")
_PLACEHOLDER_WORDS = ("password", "secret", "token", "passwd")


def is_placeholder(value: object) -> bool:
    """Whether `value` is a placeholder for a secret (compared without case, dashes or
    other punctuation, so CHANGE-ME, change_me and ChangeMe are one)."""
    if not isinstance(value, str):
        return False
    letters = re.sub(r"[^a-z0-9]", "", value.lower())
    return letters in _PLACEHOLDER_WORDS or any(m in letters for m in _PLACEHOLDER_MARKS)


def _dns_zone(value: Any) -> bool:
    if not (isinstance(value, str) and value.endswith(".") and len(value) <= 254):
        return False
    labels = value[:-1].split(".")
    return all(_DNS_LABEL.fullmatch(label) for label in labels)


def _host_port(value: str) -> tuple[str, int]:
    """('127.0.0.1', 53) of '127.0.0.1:53' or '[::1]:53'; ValueError otherwise."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not address:port")
    ipaddress.ip_address(host)
    return host, int(port)


# django-ratelimit's rates: requests / [count] unit, e.g. "120/m", "100/5m".
_RATE = re.compile(r"[0-9]+/[0-9]*[smhd]")


class Settings:
    # How to add a setting: add one row below (a Setting with its default, what a
    # value must be, the test of it, how it is resolved, a new check id and a hint
    # that says what to write instead), then one line in README.md's settings table.
    # Read it as `conf.NAME` (typed by `resolve`). The system check, the typed
    # accessor and the tests (tests/service/test_checks.py walks this table) follow.
    # Check ids: E001-E099 for rows and URLGUARD itself, E1xx for Django's settings.

    # The node's own files: the filter, the metric files, the link index, the feed
    # memos. None: <BASE_DIR>/var/urlguard, where settings.py has the BASE_DIR that
    # startproject writes; without one it must be set (the check says so).
    DATA_DIR = Setting(
        None,
        must_be="a directory path (a string); None only where settings has a BASE_DIR "
        "to put <BASE_DIR>/var/urlguard under",
        valid=_data_dir_valid,
        resolve=_data_dir,
        check_id="urlguard.E025",
        hint="e.g. URLGUARD = {'DATA_DIR': '/var/lib/urlguard'} (a directory on local "
        "disk, one per node, writable by the web server's and the worker's user).",
    )
    # The scaling counting Bloom filter file (one per node). None: <DATA_DIR>/filter.bin.
    FILTER_PATH = Setting(
        None,
        must_be="a file path (a string) or None",
        valid=lambda v: v is None or _text(v) or isinstance(v, Path),
        resolve=_filter_path,
        check_id="urlguard.E010",
        hint="e.g. '/var/lib/urlguard/filter.bin' (its directory must be writable).",
    )
    # The smallest first stage. A rebuild sizes the first stage to the rules it holds
    # times REBUILD_HEADROOM (never below this); later stages grow as rules arrive.
    FILTER_CAPACITY = Setting(
        100_000,
        must_be="a positive integer",
        valid=lambda v: _integer(v) and v > 0,
        resolve=int,
        check_id="urlguard.E003",
        hint="The capacity of the first stage, e.g. 100000; later stages grow.",
    )
    # Compounded false-positive bound over all stages. Each clean URL probes ~10
    # expressions, so 0.001 keeps the share of clean redirects that cost a confirming
    # query near 1% (0.01 would make it ~10%) for ~2.4 more bytes per rule.
    FILTER_ERROR_RATE = Setting(
        0.001,
        must_be="a number between 0 and 1 (exclusive)",
        valid=lambda v: _number(v) and 0 < v < 1,
        resolve=float,
        check_id="urlguard.E002",
        hint="e.g. 0.01 for a 1% false-positive rate (false positives only cost a "
        "database query; they never warn a user).",
    )
    REBUILD_HEADROOM = Setting(
        1.5,
        must_be="a number of at least 1",
        valid=lambda v: _number(v) and v >= 1,
        resolve=float,
        check_id="urlguard.E008",
        hint="A rebuild sizes the first stage to the rules times this, e.g. 1.5.",
    )
    # Every stage costs each lookup a few probes: the periodic catch-up rebuilds
    # (compacts into one right-sized stage) a file that has grown more stages than this.
    FILTER_MAX_STAGES = Setting(
        4,
        must_be="a positive integer",
        valid=lambda v: _integer(v) and v >= 1,
        resolve=int,
        check_id="urlguard.E009",
        hint="A file with more stages is compacted by the periodic catch-up, e.g. 4.",
    )
    # What Guard.check does when the filter cannot be read: "database" answers every
    # check from the spam table (correct, slower), "open" lets redirects through,
    # "closed" warns on every redirect. Always logged.
    ON_FILTER_ERROR = Setting(
        "database",
        must_be=f"one of {', '.join(ON_FILTER_ERROR_POLICIES)}",
        valid=lambda v: v in ON_FILTER_ERROR_POLICIES,
        resolve=str,
        check_id="urlguard.E005",
        hint="'database' answers from the spam table when the filter cannot be read; "
        "'open' lets redirects through; 'closed' warns on every redirect.",
    )
    # Check redirects to this site's own hosts too (off: only off-site destinations).
    CHECK_INTERNAL_REDIRECTS = Setting(
        False,
        must_be="True or False",
        valid=lambda v: isinstance(v, bool),
        resolve=bool,
        check_id="urlguard.E011",
        hint="e.g. True to check redirects to this site's own hosts too.",
    )
    # Location schemes other than http(s) that pass unchecked; any other scheme
    # (javascript:, data:, ...) gets the warning page.
    ALLOWED_OTHER_SCHEMES = Setting(
        ("mailto", "tel"),
        must_be="a list of URL schemes other than http and https",
        valid=lambda v: (
            _names(v)
            and all(_SCHEME.fullmatch(s) and s.lower() not in ("http", "https") for s in v)
        ),
        resolve=_schemes,
        check_id="urlguard.E012",
        hint="e.g. ['mailto', 'tel'] (a list, not a string; http and https are always checked).",
    )
    # Lifetime of the signed "continue anyway" token on the warning page, seconds.
    CONTINUE_TOKEN_MAX_AGE = Setting(
        15 * 60,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E013",
        hint="e.g. 900 (15 minutes).",
    )
    # Allowed redirects are cacheable this long (seconds), so a later block reaches
    # returning visitors.
    REDIRECT_MAX_AGE = Setting(
        90,
        must_be="a whole number of seconds, 0 or more",
        valid=lambda v: _integer(v) and v >= 0,
        resolve=int,
        check_id="urlguard.E014",
        hint="e.g. 90 (a number, not '90s'); 0 makes allowed redirects uncacheable.",
    )
    # Rules on addresses outside the public internet (private, loopback, link-local)
    # are refused unless this is on: from outside they block nothing.
    ALLOW_PRIVATE_ADDRESS_RULES = Setting(
        False,
        must_be="True or False",
        valid=lambda v: isinstance(v, bool),
        resolve=bool,
        check_id="urlguard.E015",
        hint="e.g. True to accept rules on private and loopback addresses.",
    )
    # Popular hosts a whole-host rule needs an explicit confirmation for (None: the
    # shipped list, urlguard.writepath.safety.DEFAULT_PROTECTED_HOSTS); likewise link shorteners.
    PROTECTED_HOSTS = Setting(
        None,
        must_be="None or a list of host names",
        valid=lambda v: v is None or _names(v),
        resolve=_host_names,
        check_id="urlguard.E016",
        hint="e.g. ['example.com', 'example.org'] (a list, not a string); None keeps "
        "the shipped list.",
    )
    LINK_SHORTENERS = Setting(
        None,
        must_be="None or a list of host names",
        valid=lambda v: v is None or _names(v),
        resolve=_host_names,
        check_id="urlguard.E017",
        hint="e.g. ['bit.ly', 't.co'] (a list, not a string); None keeps the shipped list.",
    )
    # A rule that would block more short links than this needs a confirmation (0: never).
    CONFIRM_IMPACT_LINKS = Setting(
        100,
        must_be="a whole number, 0 or more",
        valid=lambda v: _integer(v) and v >= 0,
        resolve=int,
        check_id="urlguard.E018",
        hint="e.g. 100; 0 never asks.",
    )
    # Where "report a mistake" on the warning page points: None for this service's
    # own report form (reports land in the admin's queue); a mailto: or URL of a desk
    # of your own overrides it.
    REPORT_MISTAKE_URL = Setting(
        None,
        must_be="None, a mailto: address or an http(s):// or /site-relative URL",
        valid=lambda v: (
            v is None
            or (
                isinstance(v, str)
                and v.startswith(("mailto:", "http://", "https://", "/"))
                and not v.startswith("//")
            )
        ),
        resolve=lambda v: v,
        check_id="urlguard.E019",
        hint="e.g. None (the built-in report form), 'mailto:abuse@example.com' or "
        "'https://example.com/report'.",
    )
    # Mistake reports one visitor may send per hour (per serving process).
    REPORT_RATE_LIMIT = Setting(
        5,
        must_be="a whole number, 1 or more",
        valid=lambda v: _integer(v) and v >= 1,
        resolve=int,
        check_id="urlguard.E051",
        hint="e.g. 5.",
    )
    # At most one mail to MANAGERS about new mistake reports per this many seconds
    # (a burst of reports is one mail with the open count); 0: no mail.
    REPORT_MAIL_INTERVAL = Setting(
        900,
        must_be="a whole number of seconds, 0 or more",
        valid=lambda v: _integer(v) and v >= 0,
        resolve=int,
        check_id="urlguard.E098",
        hint="e.g. 900 (15 minutes); 0 sends no mail.",
    )
    # Hit log events (each warning, each "continue anyway") kept: the newest this many.
    HIT_EVENTS_KEPT = Setting(
        100_000,
        must_be="a whole number, 1 or more",
        valid=lambda v: _integer(v) and v >= 1,
        resolve=int,
        check_id="urlguard.E099",
        hint="e.g. 100000.",
    )
    # Days the hit log keeps its daily rows (per rule and per blocked host); the
    # per-rule totals stay as long as the rule.
    HIT_LOG_DAYS = Setting(
        90,
        must_be="a whole number, 1 or more",
        valid=lambda v: _integer(v) and v >= 1,
        resolve=int,
        check_id="urlguard.E052",
        hint="e.g. 90.",
    )
    # Mistake reports per client address (IPv6: per /64) and hour, whatever User-Agent
    # it sends (REPORT_RATE_LIMIT counts per visitor); a few people behind a NAT share it.
    REPORT_ADDRESS_RATE_LIMIT = Setting(
        10,
        must_be="a whole number, 1 or more",
        valid=lambda v: _integer(v) and v >= 1,
        resolve=int,
        check_id="urlguard.E053",
        hint="e.g. 10 (mistake reports per client address and hour).",
    )
    # Open reports kept per destination; more are thanked for and not stored.
    REPORT_MAX_OPEN_PER_DESTINATION = Setting(
        20,
        must_be="a whole number, 1 or more",
        valid=lambda v: _integer(v) and v >= 1,
        resolve=int,
        check_id="urlguard.E054",
        hint="e.g. 20.",
    )
    # Lifetime of the report form's link (bound to the warned visitor), seconds.
    REPORT_TOKEN_MAX_AGE = Setting(
        24 * 3600,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E055",
        hint="e.g. 86400 (a day).",
    )
    # This node's name in NodeStatus (one filter file per node). None: the host name.
    NODE_NAME = Setting(
        None,
        must_be="None or a non-empty string",
        valid=lambda v: v is None or _text(v),
        resolve=_node_name,
        check_id="urlguard.E020",
        hint="e.g. 'web-1'; None uses the host name.",
    )
    # Periodic catch-up for a node that missed a broadcast (Celery beat), seconds.
    CATCHUP_INTERVAL = Setting(
        60,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E006",
        hint="e.g. 60.",
    )
    # With no broker (Celery in-process), each serving process runs that periodic
    # catch-up in a daemon thread instead of beat.
    EMBEDDED_CATCH_UP = Setting(
        True,
        must_be="True or False",
        valid=lambda v: isinstance(v, bool),
        resolve=bool,
        check_id="urlguard.E021",
        hint="e.g. False when something else runs the catch-up.",
    )
    BROADCAST_QUEUE = Setting(
        "urlguard.broadcast",
        must_be="a non-empty string",
        valid=_text,
        resolve=str,
        check_id="urlguard.E022",
        hint="The fanout queue every node's worker listens on, e.g. 'urlguard.broadcast'.",
    )
    # Rules of the table the periodic catch-up (and `sync_filter`) probes in the file,
    # drawn at random; a miss (damaged counters) rebuilds the file. 0: off.
    SPOT_CHECK_SAMPLE = Setting(
        200,
        must_be="a whole number, 0 or more",
        valid=lambda v: _integer(v) and v >= 0,
        resolve=int,
        check_id="urlguard.E023",
        hint="e.g. 200; 0 turns the spot check off.",
    )
    # Seconds between full verifies of the file against the table (about 1 s per
    # million rules), by the worker or the embedded catch-up thread; a miss
    # rebuilds the file. 0: off.
    VERIFY_INTERVAL = Setting(
        3600,
        must_be="a number of seconds, 0 or more",
        valid=lambda v: _number(v) and v >= 0,
        resolve=float,
        check_id="urlguard.E024",
        hint="e.g. 3600; 0 turns the full verify off.",
    )
    # How long a change-applying process waits for another one holding the filter's
    # writer lock (e.g. during a rebuild) before giving up and retrying later, seconds.
    WRITER_LOCK_TIMEOUT = Setting(
        30,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E007",
        hint="e.g. 30.",
    )
    # Statistics (clicks, rule hits ...) are buffered per process and written by a
    # background thread this often, seconds: also the most a kill -9 loses, and how
    # far the admin's counts may lag.
    STATS_FLUSH_INTERVAL = Setting(
        1.0,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E090",
        hint="e.g. 1: the admin's counts lag by at most this, and kill -9 loses at most this.",
    )
    # Pending entries per kind of statistic (keys of a counter, rows otherwise) while
    # the database is slow or down; beyond it the oldest are dropped and counted.
    STATS_BUFFER_MAX = Setting(
        100_000,
        must_be="a whole number, 1 or more",
        valid=lambda v: _integer(v) and v >= 1,
        resolve=int,
        check_id="urlguard.E091",
        hint="e.g. 100000 (a pending click costs ~200 bytes).",
    )
    # How long a graceful stop keeps retrying the last flush, seconds.
    STATS_STOP_TIMEOUT = Setting(
        5.0,
        must_be="a number of seconds, 0 or more",
        valid=lambda v: _number(v) and v >= 0,
        resolve=float,
        check_id="urlguard.E092",
        hint="e.g. 5; keep it below gunicorn's --graceful-timeout.",
    )
    # Short links each process keeps in memory (urlguard.shortlinks.linkcache), so that a
    # redirect reads no row and survives the database going away.
    LINK_CACHE_SIZE = Setting(
        50_000,
        must_be="a whole number, 1 or more",
        valid=lambda v: _integer(v) and v >= 1,
        resolve=int,
        check_id="urlguard.E093",
        hint="e.g. 50000 (a cached link costs ~300 bytes plus its destination).",
    )
    # A cached link is read again after this long, seconds, by the polling thread (one
    # nobody asked for is dropped): a backstop for writes that bypass the ORM (any
    # ORM change reaches the caches within LINK_CACHE_POLL).
    LINK_CACHE_TTL = Setting(
        60.0,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E094",
        hint="e.g. 60.",
    )
    # How often each process asks whether a link changed (one one-row query), seconds.
    LINK_CACHE_POLL = Setting(
        0.5,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E095",
        hint="e.g. 0.5: an edit or a disable reaches every process within this.",
    )
    # GET /readyz answers 503 while this node's filter is more than this many changes,
    # or its oldest unapplied change more than this many seconds, behind the change log.
    READY_MAX_LAG_CHANGES = Setting(
        1000,
        must_be="a whole number of changes, 0 or more",
        valid=lambda v: _integer(v) and v >= 0,
        resolve=int,
        check_id="urlguard.E070",
        hint="e.g. 1000; 0 means ready only when every change is applied.",
    )
    READY_MAX_LAG_SECONDS = Setting(
        120,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E071",
        hint="e.g. 120: an unapplied change older than this makes the node not ready.",
    )
    # Prometheus metric files of this node's processes (None: <DATA_DIR>/metrics; the
    # environment's PROMETHEUS_MULTIPROC_DIR wins).
    METRICS_DIR = Setting(
        None,
        must_be="a directory path (a string) or None",
        valid=lambda v: v is None or _text(v) or isinstance(v, Path),
        resolve=_metrics_dir,
        check_id="urlguard.E072",
        hint="e.g. '/run/urlguard/metrics' (one per node, writable by every process).",
    )
    # GET /metrics answers these networks, and any address that sends
    # "Authorization: Bearer <METRICS_TOKEN>" when that is set.
    METRICS_ALLOWED_NETWORKS = Setting(
        ("127.0.0.0/8", "::1/128"),
        must_be="a list of IP networks (CIDR), e.g. ['10.0.0.0/8']",
        valid=lambda v: _names(v) and all(_network(n) for n in v),
        resolve=lambda v: tuple(ipaddress.ip_network(n, strict=False) for n in v),
        check_id="urlguard.E073",
        hint="e.g. ['127.0.0.0/8', '::1/128', '10.0.0.0/8'] (a list, not a string); [] "
        "leaves only METRICS_TOKEN.",
    )
    METRICS_TOKEN = Setting(
        "",
        must_be="a string ('' for none), not a placeholder such as the shipped 'CHANGE-ME'",
        valid=lambda v: isinstance(v, str) and not is_placeholder(v),
        resolve=str,
        check_id="urlguard.E074",
        hint="e.g. a long random string the scraper sends as 'Authorization: Bearer ...' "
        "(python3 -c 'import secrets; print(secrets.token_urlsafe(32))').",
    )
    # The reverse proxies whose X-Forwarded-For TrustedProxyMiddleware believes: on a
    # request from one of them, REMOTE_ADDR becomes the header's first address, read
    # from the right, that is not one of them. []: REMOTE_ADDR as the server saw it.
    TRUSTED_PROXIES = Setting(
        [],
        must_be="a list of IP networks (CIDR) without host bits, each at most a /8 "
        "(IPv4) or a /32 (IPv6) and together at most two of those: a wider trusted "
        "network holds clients, and any of them could name its own address in "
        "X-Forwarded-For. E.g. ['127.0.0.1/32', '::1/128']",
        valid=_proxy_networks,
        resolve=lambda v: tuple(ipaddress.ip_network(n) for n in v),
        check_id="urlguard.E083",
        hint="the addresses your reverse proxies connect to the service from, e.g. "
        "['10.0.0.10/32'] (a list, not a string); never a network visitors connect from.",
    )
    # The check API: URLs in one POST /api/check, and the largest body it reads.
    API_MAX_URLS = Setting(
        1000,
        must_be="a positive whole number",
        valid=lambda v: _integer(v) and v > 0,
        resolve=int,
        check_id="urlguard.E075",
        hint="e.g. 1000.",
    )
    API_MAX_BODY_BYTES = Setting(
        2_000_000,
        must_be="a positive whole number of bytes",
        valid=lambda v: _integer(v) and v > 0,
        resolve=int,
        check_id="urlguard.E076",
        hint="e.g. 2000000 (about 1,000 URLs of 2,000 characters).",
    )
    # Requests per API key (POST), and per client address for the open GET, in the
    # cache's window: "<n>/<s|m|h|d>" (django-ratelimit's notation, e.g. "100/5m").
    API_KEY_RATE = Setting(
        "120/m",
        must_be="a rate like '120/m' (requests / s, m, h or d, e.g. '100/5m')",
        valid=lambda v: isinstance(v, str) and bool(_RATE.fullmatch(v)),
        resolve=str,
        check_id="urlguard.E077",
        hint="e.g. '120/m' per API key.",
    )
    API_OPEN_RATE = Setting(
        "60/m",
        must_be="a rate like '60/m' (requests / s, m, h or d, e.g. '100/5m')",
        valid=lambda v: isinstance(v, str) and bool(_RATE.fullmatch(v)),
        resolve=str,
        check_id="urlguard.E078",
        hint="e.g. '60/m' per client address.",
    )
    # Requests with a missing or wrong key (check API POSTs and /lists/ together) per
    # client address (IPv6: per /64); past it the address is refused, even with a
    # right key, until the window ends.
    API_FAILED_KEY_RATE = Setting(
        "10/m",
        must_be="a rate like '10/m' (requests / s, m, h or d, e.g. '100/5m')",
        valid=lambda v: isinstance(v, str) and bool(_RATE.fullmatch(v)),
        resolve=str,
        check_id="urlguard.E080",
        hint="e.g. '10/m' wrong keys per client address.",
    )
    # The longest URL the API checks (a longer one in a batch gets an error in its
    # slot), and the characters all URLs of one POST may add up to: the work one
    # request can ask for (canonicalizing costs about 0.1 µs per character, several
    # times that for a dense run of escapes).
    API_MAX_URL_LENGTH = Setting(
        8192,
        must_be="a positive whole number of characters",
        valid=lambda v: _integer(v) and v > 0,
        resolve=int,
        check_id="urlguard.E081",
        hint="e.g. 8192.",
    )
    API_MAX_BATCH_CHARS = Setting(
        512 * 1024,
        must_be="a positive whole number of characters",
        valid=lambda v: _integer(v) and v > 0,
        resolve=int,
        check_id="urlguard.E082",
        hint="e.g. 524288 (1,000 URLs of about 500 characters).",
    )
    # The longest text (a post, a comment, an HTML fragment) urlguard.content scans
    # for links; a longer one is refused. Scanning costs up to ~5 µs per character
    # on hostile text (e.g. "a.a.a..."), so this bounds one text's work.
    CONTENT_MAX_CHARS = Setting(
        50_000,
        must_be="a positive whole number of characters",
        valid=lambda v: _integer(v) and v > 0,
        resolve=int,
        check_id="urlguard.E067",
        hint="e.g. 50000 (a long forum post is about 10,000).",
    )
    # Log lines as JSON objects, one per line, with the node name (for log shippers).
    LOG_JSON = Setting(
        False,
        must_be="True or False",
        valid=lambda v: isinstance(v, bool),
        resolve=bool,
        check_id="urlguard.E079",
        hint="e.g. True (or URLGUARD_LOG_JSON=1 in the environment).",
    )

    # Feeds. A refresh that would remove more than this share of a source's entries is
    # held until accepted (admin action or `refresh_feeds NAME --accept-shrink`).
    FEED_SHRINK_THRESHOLD = Setting(
        0.5,
        must_be="a share above 0 and at most 1",
        valid=lambda v: _number(v) and 0 < v <= 1,
        resolve=float,
        check_id="urlguard.E040",
        hint="e.g. 0.5 (hold a refresh that removes over half of a source); 1 never holds.",
    )
    # Largest feed body accepted, downloaded and again once decompressed, bytes.
    FEED_MAX_BYTES = Setting(
        512 * 1024 * 1024,
        must_be="a positive whole number of bytes",
        valid=lambda v: _integer(v) and v > 0,
        resolve=int,
        check_id="urlguard.E041",
        hint="e.g. 536870912 (512 MiB).",
    )
    # Seconds: to resolve and connect, between two reads, and for the whole transfer
    # (a server that trickles bytes under the read timeout still ends).
    FEED_CONNECT_TIMEOUT = Setting(
        10,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E042",
        hint="e.g. 10.",
    )
    FEED_READ_TIMEOUT = Setting(
        30,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E043",
        hint="e.g. 30.",
    )
    FEED_DEADLINE = Setting(
        300,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E044",
        hint="e.g. 300.",
    )
    FEED_MAX_REDIRECTS = Setting(
        5,
        must_be="a whole number, 0 or more",
        valid=lambda v: _integer(v) and v >= 0,
        resolve=int,
        check_id="urlguard.E045",
        hint="e.g. 5; 0 follows none.",
    )
    # Failed refreshes in a row after which a source shows as failing (its rules stay).
    FEED_UNHEALTHY_FAILURES = Setting(
        3,
        must_be="a whole number of at least 1",
        valid=lambda v: _integer(v) and v >= 1,
        resolve=int,
        check_id="urlguard.E046",
        hint="e.g. 3.",
    )
    # How often due sources are looked for (beat, or the embedded runner), seconds.
    FEED_CHECK_INTERVAL = Setting(
        60,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E047",
        hint="e.g. 60.",
    )
    # Retries of a transient refresh failure (network, timeout, 5xx) by the Celery
    # task, with exponential backoff; the next due refresh tries again anyway.
    FEED_RETRIES = Setting(
        3,
        must_be="a whole number, 0 or more",
        valid=lambda v: _integer(v) and v >= 0,
        resolve=int,
        check_id="urlguard.E048",
        hint="e.g. 3; 0 never retries.",
    )
    # A refresh claim older than this (a worker died mid-refresh) is taken over, seconds.
    FEED_CLAIM_TIMEOUT = Setting(
        3600,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E049",
        hint="e.g. 3600 (longer than the slowest refresh).",
    )
    # file:// feeds are read only beneath this folder (symlinks resolved); None refuses
    # them all.
    FEED_FILE_ROOT = Setting(
        None,
        must_be="a folder path (a string) or None",
        valid=lambda v: v is None or _text(v) or isinstance(v, Path),
        resolve=lambda v: None if v is None else str(v),
        check_id="urlguard.E060",
        hint="e.g. '/srv/urlguard/feeds' (None: no file:// feeds).",
    )
    # Non-public networks (CIDR) a feed fetch may connect to; every other address that
    # is not on the public internet is refused, at every redirect hop.
    FEED_ALLOWED_NETWORKS = Setting(
        [],
        must_be="a list of networks (CIDR strings)",
        valid=lambda v: _names(v) and all(_network(n) for n in v),
        resolve=lambda v: tuple(ipaddress.ip_network(n, strict=False) for n in v),
        check_id="urlguard.E061",
        hint="e.g. ['10.20.0.0/16'] for a feed mirror on the internal network.",
    )
    # Entries one refresh may list; a body with more fails (nothing applied).
    FEED_MAX_ENTRIES = Setting(
        5_000_000,
        must_be="a positive whole number",
        valid=lambda v: _integer(v) and v > 0,
        resolve=int,
        check_id="urlguard.E062",
        hint="e.g. 5000000.",
    )
    # The longest line (or JSON item) of a feed, characters: a longer one is refused
    # and counted, the rest of the body is read.
    FEED_MAX_LINE = Setting(
        65_536,
        must_be="a whole number of characters, at least 1024",
        valid=lambda v: _integer(v) and v >= 1024,
        resolve=int,
        check_id="urlguard.E063",
        hint="e.g. 65536.",
    )
    # Seconds: a refresh is held when it lists fewer than (1 - FEED_SHRINK_THRESHOLD)
    # of the most the source listed within this window, not only of its last refresh
    # (a feed shrunk by 49% a time is held too). 0: compare with the last one only.
    FEED_SHRINK_WINDOW = Setting(
        7 * 86400,
        must_be="a number of seconds, 0 or more",
        valid=lambda v: _number(v) and v >= 0,
        resolve=float,
        check_id="urlguard.E064",
        hint="e.g. 604800 (a week).",
    )
    # With no broker, a daemon thread of each serving process refreshes due sources.
    FEED_EMBEDDED_REFRESH = Setting(
        True,
        must_be="True or False",
        valid=lambda v: isinstance(v, bool),
        resolve=bool,
        check_id="urlguard.E050",
        hint="e.g. False when something else runs refresh_feeds.",
    )
    # A long write (a feed refresh, an admin job, a change set) writes its owner's
    # heartbeat this often, seconds.
    HEARTBEAT_INTERVAL = Setting(
        10,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E065",
        hint="e.g. 10 (well under HEARTBEAT_TIMEOUT).",
    )
    # A claim, job or change set whose heartbeat is older than this is taken over
    # (its owner died on another host), seconds.
    HEARTBEAT_TIMEOUT = Setting(
        60,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E066",
        hint="e.g. 60 (several HEARTBEAT_INTERVALs, so a busy database is not taken for a death).",
    )

    # Serving the list to other enforcement points (urlguard.exports, serve_dns).
    # Consumers poll /lists/<name>: Cache-Control max-age, seconds. Pi-hole, rspamd
    # and uBO re-fetch (conditionally) after it; a render costs one per position anyway.
    EXPORT_MAX_AGE = Setting(
        300,
        must_be="a whole number of seconds, 0 or more",
        valid=lambda v: _integer(v) and v >= 0,
        resolve=int,
        check_id="urlguard.E026",
        hint="e.g. 300 (a number, not '5m'); 0 makes every poll revalidate.",
    )
    # Exports are read with an API key unless this is on (the list tells an attacker
    # which of their domains are known).
    EXPORTS_OPEN = Setting(
        False,
        must_be="True or False",
        valid=lambda v: isinstance(v, bool),
        resolve=bool,
        check_id="urlguard.E027",
        hint="e.g. True to serve /lists/ to anyone without an API key.",
    )
    # Rendered versions kept per export under <DATA_DIR>/exports: also how far back an
    # ABP differential patch reaches (an older list is fetched whole).
    EXPORT_KEEP_VERSIONS = Setting(
        20,
        must_be="a whole number, 1 or more",
        valid=lambda v: _integer(v) and v >= 1,
        resolve=int,
        check_id="urlguard.E028",
        hint="e.g. 20.",
    )
    # Bytes of renders kept per export: the newest is kept whatever its size, older ones
    # only while they fit beside it and room for the next (EXPORT_KEEP_VERSIONS bounds
    # their number), so a data directory is sized by this, not by the list's growth.
    EXPORT_KEEP_BYTES = Setting(
        100_000_000,
        must_be="a whole number of bytes, 0 or more",
        valid=lambda v: _integer(v) and v >= 0,
        resolve=int,
        check_id="urlguard.E056",
        hint="e.g. 100_000_000 (a number, not '100MB'); 0 keeps the newest render only.",
    )
    # An export whose newest render lacks a change older than this, seconds, makes the
    # node's /readyz name it degraded and its HTTP answers say they are stale.
    EXPORT_MAX_LAG_SECONDS = Setting(
        600,
        must_be="a positive number of seconds",
        valid=lambda v: _number(v) and v > 0,
        resolve=float,
        check_id="urlguard.E057",
        hint="e.g. 600 (longer than a pre-render of every export takes at your list's size).",
    )
    # The exports rendered ahead of their pollers each time this node applies changes
    # (urlguard.exports.prerender), never in a request; one left out is rendered by the
    # first poll of each position instead.
    EXPORTS_PRERENDER = Setting(
        EXPORT_NAMES,
        must_be=f"a list of export names ({', '.join(EXPORT_NAMES)})",
        valid=lambda v: _names(v) and all(n in EXPORT_NAMES for n in v),
        resolve=tuple,
        check_id="urlguard.E096",
        hint="e.g. ['hosts.txt', 'abp.txt'] (a list, not a string), or [] for none.",
    )
    # The Safe Browsing v4 Update API (urlguard.safebrowsing). Off, its endpoints answer
    # 404 and no pre-render round prepares its lists: at a million rules each position
    # costs every node seconds of CPU and ~90 MB on disk, which only its clients repay.
    SAFEBROWSING_ENABLED = Setting(
        True,
        must_be="True or False",
        valid=lambda v: isinstance(v, bool),
        resolve=bool,
        check_id="urlguard.E085",
        hint="e.g. False where no browser or client uses the Safe Browsing endpoints.",
    )
    # Safe Browsing: how long a client waits
    # between list updates (minimum_wait_duration), seconds.
    SAFEBROWSING_MIN_WAIT = Setting(
        1800,
        must_be="a whole number of seconds, 0 or more",
        valid=lambda v: _integer(v) and v >= 0,
        resolve=int,
        check_id="urlguard.E087",
        hint="e.g. 1800 (Firefox updates its lists no sooner than this).",
    )
    # How long a client caches a full hash it was answered (positive), seconds.
    SAFEBROWSING_CACHE_DURATION = Setting(
        300,
        must_be="a whole number of seconds, 0 or more",
        valid=lambda v: _integer(v) and v >= 0,
        resolve=int,
        check_id="urlguard.E088",
        hint="e.g. 300: a rule removed reaches browsers that cached its hash after this.",
    )
    # How long a client caches that a prefix matched no full hash (negative), seconds.
    SAFEBROWSING_NEGATIVE_CACHE_DURATION = Setting(
        300,
        must_be="a whole number of seconds, 0 or more",
        valid=lambda v: _integer(v) and v >= 0,
        resolve=int,
        check_id="urlguard.E089",
        hint="e.g. 300: a rule added reaches browsers that asked about its prefix after this.",
    )
    # serve_dns: the RPZ zone (transferred to resolvers) and the URIBL zone (answered
    # live), absolute names.
    DNS_RPZ_ZONE = Setting(
        "rpz.urlguard.",
        must_be="an absolute DNS name ending in a dot",
        valid=lambda v: _dns_zone(v),
        resolve=str,
        check_id="urlguard.E029",
        hint="e.g. 'rpz.example.net.' (with the trailing dot).",
    )
    DNS_URIBL_ZONE = Setting(
        "uribl.urlguard.",
        must_be="an absolute DNS name ending in a dot",
        valid=lambda v: _dns_zone(v),
        resolve=str,
        check_id="urlguard.E030",
        hint="e.g. 'uribl.example.net.' (with the trailing dot).",
    )
    # Secondaries told (DNS NOTIFY) within seconds of every change of the RPZ zone.
    DNS_NOTIFY = Setting(
        (),
        must_be="a list of 'address:port' secondaries",
        valid=lambda v: _names(v) and all(_host_port(t) for t in v),
        resolve=lambda v: tuple(_host_port(t) for t in v),
        check_id="urlguard.E031",
        hint="e.g. ['127.0.0.1:53', '[2001:db8::1]:53'] (a list, not a string).",
    )
    # Who may transfer the RPZ zone (AXFR/IXFR); everyone else is REFUSED.
    DNS_TRANSFER_NETWORKS = Setting(
        ("127.0.0.0/8", "::1/128"),
        must_be="a list of IP networks (CIDR), e.g. ['10.0.0.0/8']",
        valid=lambda v: _names(v) and all(_network(n) for n in v),
        resolve=lambda v: tuple(ipaddress.ip_network(n, strict=False) for n in v),
        check_id="urlguard.E032",
        hint="e.g. ['127.0.0.0/8', '::1/128', '10.0.0.0/8'] (a list, not a string).",
    )
    # An IXFR from a serial more changes behind than this gets the full zone.
    DNS_JOURNAL_CHANGES = Setting(
        100_000,
        must_be="a whole number, 1 or more",
        valid=lambda v: _integer(v) and v >= 1,
        resolve=int,
        check_id="urlguard.E033",
        hint="e.g. 100000.",
    )
    # Response-rate limiting: answers per second to one client network (/24, /56);
    # beyond it every second answer is a truncated one (the client retries over TCP),
    # the rest are dropped, so the server is no amplifier.
    DNS_RATE_LIMIT = Setting(
        100,
        must_be="a positive whole number of answers per second",
        valid=lambda v: _integer(v) and v > 0,
        resolve=int,
        check_id="urlguard.E034",
        hint="e.g. 100.",
    )
    # This service's address as others see it, for links it hands out elsewhere (the
    # URIBL TXT answer's report-a-mistake link). None: a site-relative path.
    PUBLIC_URL = Setting(
        None,
        must_be="None or an http(s):// URL",
        valid=lambda v: v is None or (isinstance(v, str) and v.startswith(("http://", "https://"))),
        resolve=lambda v: None if v is None else str(v).rstrip("/"),
        check_id="urlguard.E035",
        hint="e.g. 'https://guard.example.com'.",
    )


# The table, in order: name -> row.
SETTINGS: dict[str, Setting[Any]] = {
    name: row for name, row in vars(Settings).items() if isinstance(row, Setting)
}
DEFAULTS: dict[str, Any] = {name: row.default for name, row in SETTINGS.items()}

conf = Settings()
