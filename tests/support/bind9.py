"""BIND 9 (Debian's `bind9`, /usr/sbin/named) as an RPZ secondary of serve_dns, for
the tests: a named of its own in a temporary directory, on a loopback port, with no
control channel and nothing of the system's named (/etc/bind, /var/cache/bind, its
pid file) touched. An `example.` zone answers the names as if from upstream, and RPZ
rewrites those answers (`recursive-only no`: policy applies to authoritative data)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

NAMED = shutil.which("named") or "/usr/sbin/named"

CONFIG = """options {{
    directory "{directory}";
    pid-file "{directory}/named.pid";
    session-keyfile "{directory}/session.key";
    managed-keys-directory "{directory}";
    listen-on port {port} {{ 127.0.0.1; }};
    listen-on-v6 {{ none; }};
    recursion yes;
    allow-query {{ 127.0.0.1; }};
    allow-recursion {{ 127.0.0.1; }};
    dnssec-validation no;
    notify no;
    # BIND applies a new version of a policy zone at most once a minute by default.
    response-policy {{ {policies} }} recursive-only no min-update-interval 0;
}};
controls {{ }};
logging {{
    channel file {{ file "{directory}/named.log"; severity debug 3; print-time yes; }};
    category default {{ file; }};
    category xfer-in {{ file; }};
    category notify {{ file; }};
    category rpz {{ file; }};
}};
zone "{zone}" {{
    type secondary;
    primaries port {primary} {{ 127.0.0.1; }};
    file "{directory}/rpz.db";
    allow-notify {{ 127.0.0.1; }};
}};
zone "example" {{
    type primary;
    file "{directory}/example.zone";
}};
"""

LOCAL_ZONE = """zone "local.rpz" {{
    type primary;
    file "{directory}/local.rpz";
}};
"""


@contextlib.contextmanager
def running_named(
    directory: Path,
    *,
    port: int,
    primary: int,
    zone: str,
    names: dict[str, str],
    local_rpz: list[str] = (),  # type: ignore[assignment]
) -> Iterator[subprocess.Popen[bytes]]:
    """named on 127.0.0.1:`port` (foreground, one worker), secondary of the RPZ `zone`
    at 127.0.0.1:`primary`, resolving `names` (relative to example.) to their
    addresses. `local_rpz`: the records of a second policy zone listed after it, as an
    operator lists another provider's zone after this one. Stopped, and waited for,
    on leaving; its log is `directory`/named.log."""
    records = "".join(f"{name} A {address}\n" for name, address in names.items())
    (directory / "example.zone").write_text(
        "$ORIGIN example.\n$TTL 60\n@ SOA ns.example. hostmaster.example. 1 3600 600 86400 60\n"
        "@ NS ns.example.\nns A 127.0.0.1\n" + records
    )
    policies = f'zone "{zone.rstrip(".")}";'
    local = ""
    if local_rpz:
        (directory / "local.rpz").write_text(
            "$ORIGIN local.rpz.\n$TTL 60\n@ SOA ns.local.rpz. hostmaster.local.rpz. 1 3600 600"
            " 86400 60\n@ NS ns.local.rpz.\nns.local.rpz. A 127.0.0.1\n"
            + "".join(f"{line}\n" for line in local_rpz)
        )
        policies += ' zone "local.rpz";'
        local = LOCAL_ZONE.format(directory=directory)
    text = CONFIG.format(
        directory=directory, port=port, primary=primary, zone=zone.rstrip("."), policies=policies
    )
    text += local
    config = directory / "named.conf"
    config.write_text(text)
    # -g would log to stderr only: -f keeps it in the foreground with the log above.
    named = subprocess.Popen(
        [NAMED, "-f", "-c", str(config), "-n", "1", "-4"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield named
    finally:
        named.terminate()
        try:
            named.wait(10)
        except subprocess.TimeoutExpired:
            named.kill()
            named.wait(10)


def named_log(directory: Path) -> str:
    path = directory / "named.log"
    return path.read_text()[-30000:] if path.exists() else "(no named log)"
