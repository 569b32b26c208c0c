"""Unbound (Debian's `unbound`) as an RPZ secondary of serve_dns, for the tests and
bench/exports.py: a configuration on loopback ports, and an `example.` zone of the
names' real answers, as if from upstream (RPZ rewrites resolved answers, not
local-data)."""

from __future__ import annotations

import shutil
import socket
import subprocess
from pathlib import Path

UNBOUND = shutil.which("unbound") or "/usr/sbin/unbound"

CONFIG = """server:
    interface: 127.0.0.1
    port: {port}
    do-ip6: no
    do-daemonize: no
    use-syslog: no
    logfile: "{directory}/unbound.log"
    chroot: ""
    username: ""
    directory: "{directory}"
    pidfile: "{directory}/unbound.pid"
    access-control: 127.0.0.0/8 allow
    module-config: "respip iterator"
    do-not-query-localhost: no
    num-threads: 1
    so-reuseport: no
    verbosity: {verbosity}
auth-zone:
    name: "example."
    zonefile: "{directory}/example.zone"
    for-upstream: yes
    for-downstream: no
    fallback-enabled: no
remote-control:
    control-enable: no
rpz:
    name: {zone}
    primary: 127.0.0.1@{primary}
    allow-notify: 127.0.0.1
    rpz-log: yes
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        return int(udp.getsockname()[1])


def start_unbound(
    directory: Path,
    *,
    port: int,
    primary: int,
    zone: str,
    names: dict[str, str],
    verbosity: int = 1,
    local_rpz: list[str] = (),  # type: ignore[assignment]
) -> subprocess.Popen[bytes]:
    """Unbound on 127.0.0.1:`port`, secondary of the RPZ `zone` at 127.0.0.1:`primary`,
    resolving `names` (relative to example.) to their addresses. `local_rpz`: the
    records of a second policy zone (local.rpz., from a file) listed after it, as an
    operator lists another provider's zone after this one. Its log is
    `directory`/unbound.log."""
    records = "".join(f"{name} A {address}\n" for name, address in names.items())
    (directory / "example.zone").write_text(
        "$ORIGIN example.\n@ 3600 IN SOA ns.example. hostmaster.example. 1 3600 600 86400 60\n"
        "@ NS ns.example.\nns A 127.0.0.1\n" + records
    )
    config = directory / "unbound.conf"
    text = CONFIG.format(
        port=port, directory=directory, zone=zone, primary=primary, verbosity=verbosity
    )
    if local_rpz:
        (directory / "local.rpz").write_text(
            "$ORIGIN local.rpz.\n@ 3600 IN SOA ns.local.rpz. hostmaster.local.rpz. 1 3600 600"
            " 86400 60\n@ NS ns.local.rpz.\n" + "".join(f"{line}\n" for line in local_rpz)
        )
        text += f'rpz:\n    name: local.rpz.\n    zonefile: "{directory}/local.rpz"\n'
    config.write_text(text)
    return subprocess.Popen([UNBOUND, "-d", "-c", str(config)], stderr=subprocess.DEVNULL)
