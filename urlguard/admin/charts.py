"""Server-rendered SVG bar chart of the filter's stages for the dashboard: no
JavaScript and no chart library, so the page works offline and behind a strict CSP."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

# Fill ratios at which a stage's bar turns amber and red: past ~50% of its counters
# set, a stage's false-positive rate climbs fast (it is (fill)^k), so operators
# should see a full stage before the error bound is at risk.
WARN_FILL = 0.5
FULL_FILL = 0.9

ROW_HEIGHT = 46
BAR_HEIGHT = 18
LABEL_WIDTH = 130
BAR_WIDTH = 420
VALUE_WIDTH = 230


@dataclass(frozen=True)
class StageBar:
    """One stage as the chart and the table show it."""

    index: int
    first_id: int | None  # None: the stage holds no rule yet
    last_id: int | None
    count: int
    capacity: int
    k: int
    fill: float  # fraction of counters that are non-zero, 0..1
    estimated_fpr: float = 0.0
    saturated: int = 0  # counters stuck at 15 (never decremented again)

    @property
    def id_range(self) -> str:
        if self.first_id is None:
            return "no ids yet"
        return f"ids {self.first_id}–{'…' if self.last_id is None else self.last_id}"

    @property
    def time_range(self) -> str:
        """The id range as the times the rules were added (ids are added_at, in µs)."""
        if self.first_id is None:
            return "empty"
        last = "…" if self.last_id is None else _when(self.last_id)
        return f"added {_when(self.first_id)} → {last} UTC"

    @property
    def fpr_text(self) -> str:
        return format_rate(self.estimated_fpr)

    @property
    def load(self) -> float:
        """Items held against items planned, 0..1 (can exceed 1 only if the engine overfills)."""
        return self.count / self.capacity if self.capacity else 0.0


def _when(micros: int) -> str:
    return datetime.fromtimestamp(micros / 1e6, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def format_rate(rate: float) -> str:
    """A probability as a percentage that stays readable when it is tiny."""
    if rate == 0:
        return "0%"
    if rate < 1e-4:
        return f"{rate * 100:.1e}%"
    return f"{rate * 100:.3g}%"


def _colour(fill: float) -> str:
    if fill >= FULL_FILL:
        return "#ba2121"
    if fill >= WARN_FILL:
        return "#c77c02"
    return "#2e7d32"


def render_stage_chart(stages: Sequence[StageBar]) -> SafeString:
    """One horizontal bar per stage: its length is the fill ratio, the faint track
    behind it is the whole stage, and the text gives count/capacity and k."""
    if not stages:
        return format_html(
            '<svg class="stage-chart" role="img" width="{}" height="40" '
            'xmlns="http://www.w3.org/2000/svg"><title>{}</title>'
            '<text x="8" y="24">{}</text></svg>',
            LABEL_WIDTH + BAR_WIDTH, "No stages", "The filter has no stages yet.",
        )
    width = LABEL_WIDTH + BAR_WIDTH + VALUE_WIDTH
    height = ROW_HEIGHT * len(stages) + 24
    rows = []
    for row, stage in enumerate(stages):
        y = 8 + row * ROW_HEIGHT
        fill = min(max(stage.fill, 0.0), 1.0)
        rows.append(format_html(
            '<g class="stage" data-stage="{index}">'
            '<text class="label" x="0" y="{ty}">stage {index}</text>'
            '<text class="range" x="{x}" y="{ry}" font-size="10" fill-opacity="0.7">{when}</text>'
            '<rect class="track" x="{x}" y="{y}" width="{bw}" height="{bh}" rx="3" '
            'fill="#e8e8e8"/>'
            '<rect class="bar" x="{x}" y="{y}" width="{w}" height="{bh}" rx="3" fill="{c}">'
            '<title>stage {index}: fill {pct}%, {count} of {capacity} items, k={k}</title>'
            '</rect>'
            '<text class="value" x="{vx}" y="{ty}">{pct}% · {count}/{capacity} · k={k}</text>'
            '</g>',
            index=stage.index, when=f"{stage.time_range} ({stage.id_range})",
            ry=y + BAR_HEIGHT + 13, ty=y + BAR_HEIGHT - 4,
            # A stage with any fill gets at least a pixel, so "almost empty" shows.
            x=LABEL_WIDTH, y=y, bw=BAR_WIDTH, bh=BAR_HEIGHT,
            w=f"{max(BAR_WIDTH * fill, 1.0 if fill > 0 else 0.0):.1f}",
            c=_colour(fill), pct=f"{fill * 100:.1f}", count=stage.count, capacity=stage.capacity,
            k=stage.k, vx=LABEL_WIDTH + BAR_WIDTH + 10,
        ))
    # Gridlines at the warning and full thresholds make the colours self-explaining.
    axis_y = 8 + len(stages) * ROW_HEIGHT
    guides = format_html_join(
        "", '<line x1="{0}" y1="4" x2="{0}" y2="{1}" stroke="#999" stroke-dasharray="3,3"/>'
        '<text class="axis" x="{0}" y="{2}" text-anchor="middle">{3}%</text>',
        (
            (LABEL_WIDTH + BAR_WIDTH * t, axis_y - 6, axis_y + 10, int(t * 100))
            for t in (0.0, WARN_FILL, FULL_FILL, 1.0)
        ),
    )
    title = escape(f"Fill ratio of {len(stages)} filter stage(s)")
    return mark_safe(
        f'<svg class="stage-chart" role="img" aria-label="{title}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" '
        f'font-family="sans-serif" font-size="12"><title>{title}</title>'
        f'{"".join(rows)}{guides}</svg>'
    )
