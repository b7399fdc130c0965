"""Inline SVG figures: line charts, heatmaps, scatter plots and bar charts, drawn from numbers
alone (no plotting library, no JavaScript), so the report works offline and prints. Every label
passes through :func:`esc`: token strings come from an untrusted corpus."""

from __future__ import annotations

import html
import math

FONT = 'font-family="system-ui, sans-serif" font-size="11"'


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def diverging(value: float | None, limit: float) -> str:
    """Blue (negative) through white to red (positive); grey for undefined."""
    if value is None or limit <= 0 or math.isnan(value):
        return "#dddddd"
    t = max(-1.0, min(1.0, value / limit))
    if t >= 0:
        return f"rgb(255,{round(255 * (1 - t))},{round(255 * (1 - t))})"
    return f"rgb({round(255 * (1 + t))},{round(255 * (1 + t))},255)"


def sequential(value: float, limit: float = 1.0) -> str:
    """White to dark blue, for values in ``[0, limit]`` (attention weights)."""
    t = max(0.0, min(1.0, value / limit if limit > 0 else 0.0))
    return f"rgb({round(255 - 200 * t)},{round(255 - 170 * t)},{round(255 - 60 * t)})"


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    step = 10 ** math.floor(math.log10((hi - lo) / n))
    for mult in (1, 2, 5, 10):
        if (hi - lo) / (step * mult) <= n:
            step *= mult
            break
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _fmt(x: float) -> str:
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3g}M"
    if abs(x) >= 1e3:
        return f"{x / 1e3:.3g}k"
    return f"{x:.3g}"


class _Axes:
    """A plotting area with linear scales and labelled axes."""

    def __init__(self, x_range, y_range, width=520, height=240, left=56, bottom=36):
        self.x0, self.x1 = x_range
        self.y0, self.y1 = y_range
        if self.x1 == self.x0:
            self.x1 = self.x0 + 1
        if self.y1 == self.y0:
            self.y1 = self.y0 + 1
        self.width, self.height, self.left, self.bottom = width, height, left, bottom
        self.right, self.top = 12, 10

    def x(self, value: float) -> float:
        return self.left + (value - self.x0) / (self.x1 - self.x0) * (self.width - self.left - self.right)

    def y(self, value: float) -> float:
        return (
            self.height
            - self.bottom
            - (value - self.y0) / (self.y1 - self.y0) * (self.height - self.bottom - self.top)
        )

    def frame(self, x_label: str, y_label: str) -> list[str]:
        parts = [
            f'<line x1="{self.left}" y1="{self.y(self.y0)}" x2="{self.width - self.right}" y2="{self.y(self.y0)}" stroke="#444"/>',
            f'<line x1="{self.left}" y1="{self.top}" x2="{self.left}" y2="{self.y(self.y0)}" stroke="#444"/>',
        ]
        for t in _ticks(self.x0, self.x1):
            parts.append(
                f'<text x="{self.x(t):.1f}" y="{self.y(self.y0) + 14:.1f}" text-anchor="middle" {FONT}>{_fmt(t)}</text>'
            )
        for t in _ticks(self.y0, self.y1):
            parts.append(
                f'<text x="{self.left - 4}" y="{self.y(t) + 4:.1f}" text-anchor="end" {FONT}>{_fmt(t)}</text>'
            )
            parts.append(
                f'<line x1="{self.left}" y1="{self.y(t):.1f}" x2="{self.width - self.right}" y2="{self.y(t):.1f}" stroke="#eee"/>'
            )
        parts.append(
            f'<text x="{(self.left + self.width) / 2}" y="{self.height - 4}" text-anchor="middle" {FONT}>{esc(x_label)}</text>'
        )
        parts.append(
            f'<text x="12" y="{(self.height - self.bottom) / 2}" text-anchor="middle" {FONT} '
            f'transform="rotate(-90 12 {(self.height - self.bottom) / 2})">{esc(y_label)}</text>'
        )
        return parts


def _svg(width: float, height: float, parts: list[str], label: str) -> str:
    return (
        f'<svg class="figure" role="img" aria-label="{esc(label)}" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" xmlns="http://www.w3.org/2000/svg">'
        + "".join(parts)
        + "</svg>"
    )


COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def line_chart(
    series: dict[str, list[tuple[float, float]]],
    x_label: str,
    y_label: str,
    marks: list[tuple[float, str]] = (),
    label: str = "line chart",
) -> str:
    points = [p for values in series.values() for p in values if p[1] is not None]
    if not points:
        return ""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    axes = _Axes((min(xs), max(xs)), (min(0.0, min(ys)), max(ys) * 1.05))
    parts = axes.frame(x_label, y_label)
    for x, text in marks:
        parts.append(
            f'<line x1="{axes.x(x):.1f}" y1="{axes.top}" x2="{axes.x(x):.1f}" y2="{axes.y(axes.y0):.1f}" stroke="#888" stroke-dasharray="4 3"/>'
        )
        parts.append(
            f'<text x="{axes.x(x) + 3:.1f}" y="{axes.y(axes.y0) - 4:.1f}" {FONT} fill="#555">{esc(text)}</text>'
        )
    for i, (name, values) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{axes.x(x):.1f},{axes.y(y):.1f}" for x, y in values if y is not None)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{path}"/>')
        parts.append(
            f'<text x="{axes.width + 4}" y="{axes.top + 14 + 14 * i}" {FONT} fill="{colour}">{esc(name)}</text>'
        )
    return _svg(axes.width + 170, axes.height, parts, label)  # the legend right of the plot


def heatmap(
    values: list[list[float | None]],
    row_labels: list[str],
    col_labels: list[str],
    limit: float | None = None,
    cell: int = 26,
    label: str = "heatmap",
) -> str:
    """A diverging heatmap with the value in each cell's tooltip (and printed when it fits)."""
    finite = [abs(v) for row in values for v in row if v is not None and not math.isnan(v)]
    limit = limit or (max(finite) if finite else 1.0)
    left, top = (
        8 + 7 * max((len(r) for r in row_labels), default=1),
        8 + 7 * max((len(c) for c in col_labels), default=1),
    )
    parts = []
    for j, name in enumerate(col_labels):
        x = left + j * cell + cell / 2
        parts.append(
            f'<text x="{x}" y="{top - 4}" text-anchor="start" {FONT} transform="rotate(-60 {x} {top - 4})">{esc(name)}</text>'
        )
    for i, (name, row) in enumerate(zip(row_labels, values, strict=True)):
        y = top + i * cell
        parts.append(
            f'<text x="{left - 4}" y="{y + cell / 2 + 4}" text-anchor="end" {FONT}>{esc(name)}</text>'
        )
        for j, value in enumerate(row):
            tip = f"{row_labels[i]} → {col_labels[j]}: " + ("undefined" if value is None else f"{value:.3f}")
            parts.append(
                f'<rect x="{left + j * cell}" y="{y}" width="{cell - 1}" height="{cell - 1}" fill="{diverging(value, limit)}">'
                f"<title>{esc(tip)}</title></rect>"
            )
            if value is not None and cell >= 24:
                parts.append(
                    f'<text x="{left + j * cell + cell / 2}" y="{y + cell / 2 + 3}" text-anchor="middle" font-size="8" '
                    f'font-family="system-ui, sans-serif" pointer-events="none">{value:.2f}</text>'
                )
    width = left + cell * len(col_labels) + 8
    height = top + cell * len(row_labels) + 8
    return _svg(width, height, parts, label)


def scatter(
    points: list[dict],
    x_label: str,
    y_label: str,
    x_range: tuple[float, float],
    y_range: tuple[float, float],
    label: str = "scatter plot",
    width: int = 420,
    height: int = 300,
    zero_lines: bool = True,
    radius: float = 4.0,
) -> str:
    """Points ``{"x", "y", "label", "colour"?}``; the label is the tooltip."""
    axes = _Axes(x_range, y_range, width=width, height=height)
    parts = axes.frame(x_label, y_label)
    if zero_lines:
        if axes.x0 < 0 < axes.x1:
            parts.append(
                f'<line x1="{axes.x(0):.1f}" y1="{axes.top}" x2="{axes.x(0):.1f}" y2="{axes.y(axes.y0):.1f}" stroke="#bbb"/>'
            )
        if axes.y0 < 0 < axes.y1:
            parts.append(
                f'<line x1="{axes.left}" y1="{axes.y(0):.1f}" x2="{axes.width - axes.right}" y2="{axes.y(0):.1f}" stroke="#bbb"/>'
            )
    for p in points:
        colour = p.get("colour", COLOURS[0])
        parts.append(
            f'<circle cx="{axes.x(p["x"]):.1f}" cy="{axes.y(p["y"]):.1f}" r="{radius}" fill="{colour}" fill-opacity="0.75">'
            f"<title>{esc(p.get('label', ''))}</title></circle>"
        )
        if p.get("text"):  # right of the point (left near the right edge), above it (below near the top)
            right = axes.x(p["x"]) > axes.width - 60
            x, anchor = axes.x(p["x"]) + (-6 if right else 6), "end" if right else "start"
            y = axes.y(p["y"]) + (14 if axes.y(p["y"]) < axes.top + 14 else -5)
            parts.append(
                f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {FONT}>{esc(p["text"])}</text>'
            )
    return _svg(axes.width, axes.height, parts, label)


def bars(items: list[tuple[str, float]], x_label: str, label: str = "bar chart") -> str:
    """Horizontal bars, positive to the right, negative to the left of zero."""
    if not items:
        return ""
    lo, hi = min(0.0, *(v for _, v in items)), max(0.0, *(v for _, v in items))
    hi = hi if hi > lo else lo + 1
    left, row, width = 8 + 7 * max(len(n) for n, _ in items), 20, 520
    scale = (width - left - 60) / (hi - lo)
    zero = left + (0 - lo) * scale
    parts = [f'<line x1="{zero:.1f}" y1="0" x2="{zero:.1f}" y2="{row * len(items)}" stroke="#444"/>']
    for i, (name, value) in enumerate(items):
        x = zero + min(0, value) * scale
        parts.append(f'<text x="{left - 4}" y="{i * row + 14}" text-anchor="end" {FONT}>{esc(name)}</text>')
        parts.append(
            f'<rect x="{x:.1f}" y="{i * row + 3}" width="{abs(value) * scale:.1f}" height="{row - 6}" '
            f'fill="{COLOURS[0] if value >= 0 else COLOURS[1]}"><title>{esc(name)}: {value:.4f}</title></rect>'
        )
        parts.append(
            f'<text x="{zero + max(0, value) * scale + 4:.1f}" y="{i * row + 14}" {FONT}>{value:+.3f}</text>'
        )
    parts.append(f'<text x="{left}" y="{row * len(items) + 16}" {FONT}>{esc(x_label)}</text>')
    return _svg(width, row * len(items) + 22, parts, label)
