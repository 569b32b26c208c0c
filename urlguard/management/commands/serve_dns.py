"""`manage.py serve_dns [--address A] [--port P]`: this node's DNS server, the RPZ
zone (AXFR/IXFR, NOTIFY) and the live URIBL zone (urlguard.exports.dnsserver)."""

from __future__ import annotations

import signal
import threading

from django.core.management.base import BaseCommand, CommandError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Command(BaseCommand):
    help = (
        "Serve the RPZ zone (DNS_RPZ_ZONE, transferred by AXFR/IXFR to "
        "DNS_TRANSFER_NETWORKS, NOTIFY to DNS_NOTIFY after every change) and the URIBL "
        "zone (DNS_URIBL_ZONE, answered live from the guard) over UDP and TCP. Any other "
        "name is REFUSED: this is no resolver. Runs until SIGTERM or Ctrl-C."
    )

    def add_arguments(self, parser):
        parser.add_argument("--address", default="127.0.0.1", help="default: 127.0.0.1")
        parser.add_argument("--port", type=int, default=53, help="UDP and TCP; default: 53")

    def handle(self, *args, address: str, port: int, **options):
        try:
            # dnspython is the optional [dns] extra: without it, a clear error.
            from urlguard.exports.dnsserver import DnsConfig, DnsServer
        except ImportError as exc:  # the `dns` extra
            raise CommandError(
                f"serve_dns needs dnspython ({exc}): pip install 'urlguard[dns]'"
            ) from exc
        server = DnsServer(DnsConfig.from_settings(address))
        try:
            bound = server.start(address, port)
        except OSError as exc:  # in use, not this host's address, or a privileged port
            raise CommandError(
                f"serve_dns cannot listen on {address} port {port} (UDP and TCP): "
                f"{exc.strerror or exc}. Stop what serves there, or pick another --address "
                "or --port."
            ) from exc
        config = server.config
        self.stdout.write(
            f"serve_dns on {bound[0]} port {bound[1]} (UDP and TCP): RPZ {config.rpz_zone}, "
            f"URIBL {config.uribl_zone}; NOTIFY {len(config.notify)} secondaries."
        )
        self.stdout.flush()
        stop = threading.Event()
        previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in STOP_SIGNALS}
        try:
            while not stop.wait(1.0):
                pass
        finally:
            server.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        self.stdout.write("serve_dns stopped.")
