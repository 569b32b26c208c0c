"""Server-rendered SVG bar chart of the filter's stages for the dashboard: no
JavaScript and no chart library, so the page works offline and behind a strict CSP."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime

from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

# The main bar is a stage's load (rules held against the capacity it was sized for):
# a scaling filter fills one stage, closes it and opens the next, so "how full" is
# what an operator asks. The fill ratio (counters set) rides beneath it as a thin
# bar: at full load it is well under 100% by design, so alone it made a full stage
# look nearly empty. Colour says health: red when the stage's estimated
# false-positive rate exceeds the rate it was built for (rebuild), amber when the
# open stage is nearly full, grey-blue for a full (closed) stage, green otherwise.
NEARLY_FULL = 0.9
COLOURS = {"over": "#ba2121", "nearly-full": "#c77c02", "closed": "#5b7a95", "ok": "#2e7d32"}

ROW_HEIGHT = 52
BAR_HEIGHT = 16
FILL_HEIGHT = 5
LABEL_WIDTH = 70
BAR_WIDTH = 420
VALUE_WIDTH = 300
LEGEND_HEIGHT = 40


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
    error_rate: float | None = None  # the false-positive rate the stage was sized for

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
    def target_text(self) -> str:
        return "" if self.error_rate is None else format_rate(self.error_rate)

    @property
    def load(self) -> float:
        """Items held against items planned, 0..1 (can exceed 1 only if the engine overfills)."""
        return self.count / self.capacity if self.capacity else 0.0

    @property
    def over_target(self) -> bool:
        return self.error_rate is not None and self.estimated_fpr > self.error_rate

    def health(self, *, last: bool) -> str:
        """One of COLOURS' keys; `last`: this is the open stage that takes new rules."""
        if self.over_target:
            return "over"
        if self.load >= 1.0 and not last:
            return "closed"
        if self.load >= NEARLY_FULL:
            return "nearly-full"
        return "ok"


def _when(micros: int) -> str:
    return datetime.fromtimestamp(micros / 1e6, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def format_rate(rate: float) -> str:
    """A probability as a person reads it: a plain percentage (no exponent), and for a
    small one also "about 1 in N" with N rounded to two figures."""
    if rate <= 0:
        return "0%"
    if rate >= 0.01:
        return f"{rate * 100:.3g}%"
    percent = rate * 100
    # Format "g" keeps two figures but turns to an exponent below 1e-4; past that,
    # fixed point to seven places (and below even that, an upper bound).
    if percent >= 1e-4:
        text = f"{percent:.2g}"
    elif percent >= 1e-7:
        text = f"{percent:.7f}".rstrip("0")
    else:
        # Below that, "about 1 in 28 septillion" reads as noise: an upper bound is all
        # a person needs.
        return "<0.0000001% (fewer than 1 in a billion)"
    one_in = int(1 / rate)
    # Two significant figures in integer arithmetic (rounding the float kept its
    # binary noise: "1 in 27,999,999,999,999,997,869,...").
    step = 10 ** max(len(str(one_in)) - 2, 0)
    rounded = (one_in + step // 2) // step * step
    return f"{text}% (about 1 in {rounded:,})"


def render_stage_chart(stages: Sequence[StageBar]) -> SafeString:
    """One row per stage: a bar for its load (rules held / capacity) over a faint track
    of the whole capacity, a thin bar beneath for the counters set, the figures to the
    right, the time range of its rules below; a legend explains the colours."""
    if not stages:
        return format_html(
            '<svg class="stage-chart" role="img" width="{}" height="40" '
            'xmlns="http://www.w3.org/2000/svg"><title>{}</title>'
            '<text x="8" y="24">{}</text></svg>',
            LABEL_WIDTH + BAR_WIDTH,
            "No stages",
            "The filter has no stages yet.",
        )
    width = LABEL_WIDTH + BAR_WIDTH + VALUE_WIDTH
    axis_y = 8 + len(stages) * ROW_HEIGHT
    height = axis_y + 16 + LEGEND_HEIGHT
    rows = []
    for row, stage in enumerate(stages):
        y = 8 + row * ROW_HEIGHT
        load = min(max(stage.load, 0.0), 1.0)
        fill = min(max(stage.fill, 0.0), 1.0)
        health = stage.health(last=row == len(stages) - 1)
        rows.append(
            format_html(
                '<g class="stage stage-{health}" data-stage="{index}">'
                '<text class="label" x="0" y="{ty}">stage {index}</text>'
                '<rect class="track" x="{x}" y="{y}" width="{bw}" height="{bh}" rx="3" '
                'fill="#e8e8e8"/>'
                '<rect class="bar" x="{x}" y="{y}" width="{w}" height="{bh}" rx="3" fill="{c}">'
                "<title>stage {index}: {count} of {capacity} rules ({load}%), {fill}% of "
                "counters set, k={k}, false-positive rate {fpr}</title></rect>"
                '<rect class="fill" x="{x}" y="{fy}" width="{fw}" height="{fh}" fill="#79aec8"/>'
                '<text class="value" x="{vx}" y="{ty}">{count} / {capacity} rules ({load}%)</text>'
                '<text class="value-detail" x="{vx}" y="{dy}" font-size="10" fill-opacity="0.8">'
                "{fill}% of counters set · k={k}{over}</text>"
                '<text class="range" x="{x}" y="{ry}" font-size="10" fill-opacity="0.7">{when}'
                "</text></g>",
                index=stage.index,
                health=health,
                x=LABEL_WIDTH,
                y=y,
                bw=BAR_WIDTH,
                bh=BAR_HEIGHT,
                ty=y + BAR_HEIGHT - 3,
                fy=y + BAR_HEIGHT + 2,
                fh=FILL_HEIGHT,
                dy=y + BAR_HEIGHT + 8,
                ry=y + BAR_HEIGHT + FILL_HEIGHT + 16,
                # Anything at all gets a pixel, so "almost empty" still shows.
                w=f"{max(BAR_WIDTH * load, 1.0 if stage.count else 0.0):.1f}",
                fw=f"{max(BAR_WIDTH * fill, 1.0 if fill > 0 else 0.0):.1f}",
                c=COLOURS[health],
                count=f"{stage.count:,}",
                capacity=f"{stage.capacity:,}",
                load=f"{stage.load * 100:.0f}",
                fill=f"{fill * 100:.1f}",
                k=stage.k,
                fpr=stage.fpr_text,
                when=stage.time_range,
                vx=LABEL_WIDTH + BAR_WIDTH + 10,
                over=" · false positives above target: rebuild" if stage.over_target else "",
            )
        )
    guides = format_html_join(
        "",
        '<line x1="{0}" y1="4" x2="{0}" y2="{1}" stroke="#999" stroke-dasharray="3,3"/>'
        '<text class="axis" x="{0}" y="{2}" text-anchor="middle">{3}%</text>',
        (
            (LABEL_WIDTH + BAR_WIDTH * t, axis_y - 4, axis_y + 10, int(t * 100))
            for t in (0.0, 0.5, 1.0)
        ),
    )
    legend_items = [
        (COLOURS["ok"], "rules held / capacity"),
        (COLOURS["closed"], "full (closed) stage"),
        (COLOURS["nearly-full"], "open stage ≥ 90% full"),
        (COLOURS["over"], "false-positive rate above target"),
    ]
    legend_y = axis_y + 26
    legend = format_html_join(
        "",
        (
            '<rect x="{0}" y="{1}" width="10" height="10" fill="{2}"/>'
            '<text class="legend" x="{3}" y="{4}" font-size="10">{5}</text>'
        ),
        (
            (8 + i * 175, legend_y, colour, 22 + i * 175, legend_y + 9, text)
            for i, (colour, text) in enumerate(legend_items)
        ),
    )
    legend += format_html(
        '<rect x="8" y="{}" width="10" height="4" fill="#79aec8"/>'
        '<text class="legend" x="22" y="{}" font-size="10">thin bar: share of counters set '
        "(the fill ratio; about half at full load is normal)</text>",
        legend_y + 18,
        legend_y + 23,
    )
    title = escape(f"Load and fill of {len(stages)} filter stage(s)")
    return mark_safe(
        f'<svg class="stage-chart" role="img" aria-label="{title}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" '
        f'font-family="sans-serif" font-size="12"><title>{title}</title>'
        f"{''.join(rows)}{guides}{legend}</svg>"
    )


def render_daily_hits(days: Sequence[tuple[date, int]]) -> SafeString:
    """A small SVG column chart of warnings shown per day (the hit log), one column
    per day with its count above and its weekday below."""
    width, height, top, bottom = 28 * len(days) + 8, 110, 16, 18
    peak = max((n for _, n in days), default=0) or 1
    usable = height - top - bottom
    columns = []
    for i, (day, n) in enumerate(days):
        h = round(usable * n / peak)
        x = 8 + i * 28
        y = top + usable - h
        columns.append(
            format_html(
                '<g class="day"><title>{}: {} warnings</title>'
                '<rect class="day-bar" x="{}" y="{}" width="20" height="{}" fill="#c77c02"/>'
                '<text x="{}" y="{}" text-anchor="middle" font-size="9">{}</text>'
                '<text x="{}" y="{}" text-anchor="middle" font-size="9">{}</text></g>',
                day.isoformat(),
                f"{n:,}",
                x,
                y,
                max(h, 1 if n else 0),
                x + 10,
                y - 3,
                f"{n:,}",
                x + 10,
                height - 5,
                day.strftime("%a"),
            )
        )
    title = escape(f"Warnings shown per day, last {len(days)} days")
    return mark_safe(
        f'<svg class="hits-chart" role="img" aria-label="{title}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg" '
        f'font-family="sans-serif"><title>{title}</title>{"".join(columns)}</svg>'
    )
