"""`manage.py filter_info`: what this node's filter file holds and how far behind it is."""

from __future__ import annotations

import json
import os

from urlguard.conf import conf
from urlguard.models import ChangeEvent, NodeStatus, SpamRule
from urlguard.nodesync.nodestatus import jsonable
from urlguard.nodesync.sync import log_head

from ._filterfile import DiagnosticCommand, add_path_argument, open_readonly


class Command(DiagnosticCommand):
    help = (
        "Describe this node's filter file: its stages (id range, count, capacity, fill, k), "
        "size, estimated false-positive rate, whether it is clean, and its applied_seq "
        "against the head of the change log (the lag), plus what every node last reported. "
        "Exits non-zero if the file is missing or unreadable."
    )

    def add_arguments(self, parser):
        add_path_argument(parser)
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, path: str | None = None, json: bool = False, **options):
        path = path or conf.FILTER_PATH
        filt = open_readonly(path)
        try:
            info = jsonable(filt.info())
            applied, clean = filt.applied_seq, filt.is_clean
            generation = getattr(filt, "generation", None)
        finally:
            filt.close()
        head = log_head()
        pending = ChangeEvent.objects.filter(seq__gt=applied).count()
        report = {
            "path": path,
            "file_bytes": os.path.getsize(path),
            "generation": generation,
            "is_clean": clean,
            "applied_seq": applied,
            "log_head": head,
            "pending_changes": pending,
            "rules_in_table": SpamRule.objects.count(),
            "info": info,
            "nodes": [
                {
                    "node": n.node,
                    "applied_seq": n.applied_seq,
                    "lag": head - n.applied_seq,
                    "is_clean": n.is_clean,
                    "reported_at": n.reported_at.isoformat(),
                    "last_error": n.last_error,
                }
                for n in NodeStatus.objects.order_by("node")
            ],
        }
        if json:
            self.stdout.write(_dumps(report))
            return
        self._print(report)

    def _print(self, r: dict) -> None:
        w = self.stdout.write
        info = r["info"]
        w(f"filter file      {r['path']} ({r['file_bytes']:,} bytes, generation {r['generation']})")
        w(f"state            {'clean' if r['is_clean'] else 'DIRTY: run rebuild_filter'}")
        lag = r["log_head"] - r["applied_seq"]
        w(
            f"applied_seq      #{r['applied_seq']} of log head #{r['log_head']} "
            f"(lag {lag} seq, {r['pending_changes']} change(s) pending)"
        )
        w(f"rules in table   {r['rules_in_table']:,}")
        for key in (
            "capacity",
            "error_rate",
            "count",
            "bytes",
            "estimated_fpr",
            "false_positive_rate",
            "fpr",
        ):
            if key in info and not isinstance(info[key], (list, dict)):
                w(f"{key:<17}{info[key]}")
        stages = info.get("stages") or []
        if stages:
            # A stage's own false-positive estimate shows which one spoils the
            # total; saturated counters are stuck at 15 (never decremented).
            cols = [
                c
                for c in (
                    "first_id",
                    "last_id",
                    "id_range",
                    "count",
                    "capacity",
                    "fill",
                    "k",
                    "error_rate",
                    "estimated_fpr",
                    "saturated",
                    "bytes",
                )
                if c in stages[0]
            ]
            rows = [[_cell(stage.get(c)) for c in cols] for stage in stages]
            widths = [max(len(c), *(len(r[j]) for r in rows)) for j, c in enumerate(cols)]
            w("")
            w("stage  " + "  ".join(f"{c:>{n}}" for c, n in zip(cols, widths, strict=True)))
            for i, row in enumerate(rows):
                w(f"{i:>5}  " + "  ".join(f"{v:>{n}}" for v, n in zip(row, widths, strict=True)))
        if r["nodes"]:
            w("")
            w(f"{'node':<30} {'applied_seq':>12} {'lag':>6} {'clean':>6}  reported")
            for n in r["nodes"]:
                w(
                    f"{n['node']:<30} {n['applied_seq']:>12} {n['lag']:>6} "
                    f"{'yes' if n['is_clean'] else 'NO':>6}  {n['reported_at']}"
                    + (f"  error: {n['last_error']}" if n["last_error"] else "")
                )


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return "-".join(str(v) for v in value)
    return str(value)


def _dumps(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True)
