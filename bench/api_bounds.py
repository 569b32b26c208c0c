"""Benchmark: what one `POST /api/check` can cost, the review's hostile batch beside a
normal one, through the real view (Django's test client, in-process, on a temporary
embedded SQLite database and filter with a few rules).

- 66 URLs of 9,900 x "%25": fits API_MAX_BODY_BYTES (1.96 MB), refused by
  API_MAX_BATCH_CHARS (413) before any URL is canonicalized;
- 64 URLs of 2,700 x "%25": the most escape-dense batch both caps admit (~0.5 M chars);
- 1,000 ordinary URLs (the common batch), the floor to compare with.

    .venv/bin/python bench/api_bounds.py [--repeat 5]

Prints the best of `repeat` runs per row and its ratio to the ordinary batch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    var = tempfile.mkdtemp(prefix="urlguard-bench-api-bounds-")
    os.environ["URLGUARD_VAR_DIR"] = var
    os.environ.pop("URLGUARD_FILTER_PATH", None)
    os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "urlguard_service.settings")
    try:
        run(args.repeat)
    finally:
        shutil.rmtree(var, ignore_errors=True)


def run(repeat: int) -> None:
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client

    from urlguard.nodesync import sync
    from urlguard.operations import apikeys
    from urlguard.writepath.changes import add_rule

    call_command("migrate", verbosity=0)
    settings.URLGUARD = {**settings.URLGUARD, "API_KEY_RATE": "1000000/m"}
    for i in range(20):
        add_rule(f"d{i}-spam.example/", category="spam", source="bench")
    sync.rebuild(settings.URLGUARD["FILTER_PATH"])
    key = apikeys.create_api_key("bench")[1]
    client = Client()
    auth = f"Bearer {key}"

    def best(urls: list[str]) -> tuple[int, float]:
        body = json.dumps({"urls": urls})
        fastest = float("inf")
        status = 0
        for _ in range(repeat):
            started = time.perf_counter()
            response = client.post(
                "/api/check", body, content_type="application/json", HTTP_AUTHORIZATION=auth
            )
            fastest = min(fastest, time.perf_counter() - started)
            status = response.status_code
        return status, fastest

    ordinary = [f"https://shop{i}.example/item/{i}?ref=mail" for i in range(1000)]
    rows = [
        ("66 URLs of 9,900 x %25 (the review's)", ["http://a.example/" + "%25" * 9900] * 66),
        ("64 URLs of 2,700 x %25 (densest admitted)", ["http://a.example/" + "%25" * 2700] * 64),
        ("1,000 ordinary URLs", ordinary),
    ]
    results = [(name, sum(map(len, urls)), *best(urls)) for name, urls in rows]
    floor = results[-1][3]
    print(f"{'batch':<44} {'chars':>10} {'status':>6} {'seconds':>8} {'x ordinary':>10}")
    for name, chars, status, seconds in results:
        print(f"{name:<44} {chars:>10,} {status:>6} {seconds:>8.3f} {seconds / floor:>10.1f}")


if __name__ == "__main__":
    main()
