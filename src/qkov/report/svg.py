"""Inline SVG figures: line charts, heatmaps, scatter plots and bar charts, drawn from numbers
alone (no plotting library, no JavaScript), so the report works offline and prints. Every label
passes through :func:`esc`: token strings come from an untrusted corpus."""

from __future__ import annotations

import base64
import bisect
import html
import math
import struct
import zlib

FONT = 'font-family="system-ui, sans-serif" font-size="11"'
SMALL_FONT = 'font-family="system-ui, sans-serif" font-size="8"'
CELL_FONT = 'font-family="system-ui, sans-serif" font-size="10"'


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def diverging_rgb(value: float | None, limit: float) -> tuple[int, int, int]:
    """Blue (negative) through white to red (positive), saturating at ``limit``; grey for undefined."""
    if value is None or limit <= 0 or math.isnan(value):
        return (221, 221, 221)
    t = max(-1.0, min(1.0, value / limit))
    if t >= 0:
        return (255, round(255 * (1 - t)), round(255 * (1 - t)))
    return (round(255 * (1 + t)), round(255 * (1 + t)), 255)


def diverging(value: float | None, limit: float) -> str:
    return "rgb({},{},{})".format(*diverging_rgb(value, limit))


def sequential(value: float, limit: float = 1.0) -> str:
    """White to dark blue, for values in ``[0, limit]`` (attention weights)."""
    t = max(0.0, min(1.0, value / limit if limit > 0 else 0.0))
    return f"rgb({round(255 - 200 * t)},{round(255 - 170 * t)},{round(255 - 60 * t)})"


def _line(x1: float, y1: float, x2: float, y2: float, stroke: str, extra: str = "") -> str:
    return f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}"{extra}/>'


def _text(x: float, y: float, content: str, anchor: str = "start", extra: str = "", font: str = FONT) -> str:
    """A label; ``content`` must already be escaped (or be a number)."""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" {font}{extra}>{content}</text>'


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
    if abs(x) >= 1e9:
        return f"{x / 1e9:.3g}B"
    if abs(x) >= 1e6:
        return f"{x / 1e6:.3g}M"
    if abs(x) >= 1e3:
        return f"{x / 1e3:.3g}k"
    return f"{x:.3g}"


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Ticks of a log axis whose range is ``[lo, hi]`` in log10 units: 1, 2 and 5 times each power of
    ten, or the powers alone when those are too many."""
    powers = range(math.floor(lo), math.ceil(hi) + 1)
    for mults in ((1, 2, 5), (1,)):
        ticks = [math.log10(m) + p for p in powers for m in mults if lo <= math.log10(m) + p <= hi]
        if len(ticks) <= 8:
            return ticks
    return ticks


class _Axes:
    """A plotting area with labelled axes: linear scales, or a log10 x scale (``log_x``: ``x(value)``
    takes the value itself, ``x_range`` is given in values)."""

    def __init__(self, x_range, y_range, width=520, height=240, left=56, bottom=36, log_x=False):
        self.log_x = log_x
        self.x0, self.x1 = (math.log10(v) for v in x_range) if log_x else x_range
        self.y0, self.y1 = y_range
        if self.x1 == self.x0:
            self.x1 = self.x0 + 1
        if self.y1 == self.y0:
            self.y1 = self.y0 + 1
        self.width, self.height, self.left, self.bottom = width, height, left, bottom
        self.right, self.top = 12, 10

    def x(self, value: float) -> float:
        at = math.log10(value) if self.log_x else value
        return self.left + (at - self.x0) / (self.x1 - self.x0) * (self.width - self.left - self.right)

    def _x_ticks(self) -> list[tuple[float, str]]:
        """``(position, label)`` of each x tick."""
        if self.log_x:
            return [(self.x(10**t), _fmt(10**t)) for t in _log_ticks(self.x0, self.x1)]
        return [(self.x(t), _fmt(t)) for t in _ticks(self.x0, self.x1)]

    def band(self, start: float, end: float, title: str) -> str:
        """A shaded span of x values (a window of training) over the plotting area."""
        x0, x1 = self.x(start), self.x(end)
        return (
            f'<rect x="{x0:.1f}" y="{self.top}" width="{max(x1 - x0, 1):.1f}" '
            f'height="{self.y(self.y0) - self.top:.1f}" fill="#ff7f0e" fill-opacity="0.18">'
            f"<title>{esc(title)}</title></rect>"
        )

    def y(self, value: float) -> float:
        return (
            self.height
            - self.bottom
            - (value - self.y0) / (self.y1 - self.y0) * (self.height - self.bottom - self.top)
        )

    def frame(self, x_label: str, y_label: str) -> list[str]:
        bottom, right = self.y(self.y0), self.width - self.right
        parts = [
            _line(self.left, bottom, right, bottom, "#444"),
            _line(self.left, self.top, self.left, bottom, "#444"),
        ]
        for x, label in self._x_ticks():
            parts.append(_text(x, bottom + 14, label, "middle"))
        for t in _ticks(self.y0, self.y1):
            parts.append(_text(self.left - 4, self.y(t) + 4, _fmt(t), "end"))
            parts.append(_line(self.left, self.y(t), right, self.y(t), "#eee"))
        parts.append(_text((self.left + self.width) / 2, self.height - 4, esc(x_label), "middle"))
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


def _marks(axes: _Axes, marks: list[tuple[float, str]]) -> list[str]:
    """Dashed vertical lines at x values, labelled at their foot."""
    parts = []
    for x, text in marks:
        parts.append(
            _line(axes.x(x), axes.top, axes.x(x), axes.y(axes.y0), "#555", ' stroke-dasharray="4 3"')
        )
        parts.append(_text(axes.x(x) + 3, axes.y(axes.y0) - 4, esc(text), extra=' fill="#333"'))
    return parts


COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def line_chart(
    series: dict[str, list[tuple[float, float | None]]],
    x_label: str,
    y_label: str,
    marks: list[tuple[float, str]] = (),
    label: str = "line chart",
    log_x: bool = False,
    bands: list[tuple[float, float, str]] = (),
) -> str:
    """Lines through ``(x, y)`` points (``None`` skipped; on a log x axis, points at x <= 0 too), the
    y axis spanning zero; ``marks`` are dashed vertical lines, ``bands`` shaded spans
    ``(start, end, title)``."""
    series = {
        name: [(x, y) for x, y in values if y is not None and (x > 0 or not log_x)]
        for name, values in series.items()
    }
    points = [p for values in series.values() for p in values]
    if not points:
        return ""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    lo, hi = min(0.0, min(ys)), max(0.0, max(ys))
    axes = _Axes((min(xs), max(xs)), (lo, hi + 0.05 * (hi - lo)), log_x=log_x)
    parts = [axes.band(start, end, title) for start, end, title in bands] + axes.frame(x_label, y_label)
    parts += _marks(axes, marks)
    for i, (name, values) in enumerate(series.items()):
        colour = COLOURS[i % len(COLOURS)]
        path = " ".join(f"{axes.x(x):.1f},{axes.y(y):.1f}" for x, y in values)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{path}"/>')
        if len(values) == 1:  # a polyline through one point draws nothing
            ((x, y),) = values
            parts.append(f'<circle cx="{axes.x(x):.1f}" cy="{axes.y(y):.1f}" r="3" fill="{colour}"/>')
        parts.append(_text(axes.width + 4, axes.top + 14 + 14 * i, esc(name), extra=f' fill="{colour}"'))
    return _svg(axes.width + 170, axes.height, parts, label)  # the legend right of the plot


BAR_STEPS = 40  # rectangles in a colour bar (no gradient ids: many figures share one page)


def colour_bar(
    x: float,
    y: float,
    height: float,
    limit: float,
    caption: str = "",
    marks: list[tuple[float, str]] = (),
    colour=None,
    low: float | None = None,
) -> list[str]:
    """A vertical colour bar at ``(x, y)``, ``limit`` at the top and ``low`` (``-limit`` unless
    given) at the bottom, coloured by ``colour(value)`` (:func:`diverging` against ``limit`` unless
    given), ticked at both ends and at zero, with ``marks`` ``(value, text)`` drawn across it (a
    random baseline), and ``caption`` (what the colour measures) above it."""
    low = -limit if low is None else low
    colour = colour or (lambda v: diverging(v, limit))
    step = height / BAR_STEPS
    parts = [
        f'<rect x="{x:.1f}" y="{y + i * step:.1f}" width="12" height="{step + 0.5:.1f}" '
        f'fill="{colour(limit - (i + 0.5) / BAR_STEPS * (limit - low))}"/>'
        for i in range(BAR_STEPS)
    ]
    parts.append(
        f'<rect x="{x:.1f}" y="{y:.1f}" width="12" height="{height:.1f}" fill="none" stroke="#888"/>'
    )

    def at(value: float) -> float:
        return y + (limit - value) / (limit - low) * height if limit > low else y

    for value in dict.fromkeys((limit, 0.0, low)):
        if low <= value <= limit:
            parts.append(_line(x + 12, at(value), x + 15, at(value), "#444"))
            parts.append(_text(x + 17, at(value) + 4, _fmt(value), extra=' class="bar-tick"'))
    for value, text in marks:
        if low <= value <= limit:
            parts.append(
                _line(
                    x - 3, at(value), x + 15, at(value), "#000", ' stroke-width="1.5" stroke-dasharray="3 2"'
                )
            )
            parts.append(_text(x - 5, at(value) + 4, esc(text), "end", ' class="bar-mark"', SMALL_FONT))
    if caption:
        parts.append(_text(x, y - 6, esc(caption), extra=' class="bar-caption"', font=SMALL_FONT))
    return [f'<g class="colour-bar" data-limit="{limit:.6g}">', *parts, "</g>"]


def shared_limit(*grids: list[list[float | None]]) -> float:
    """The largest ``|value|`` of every grid: one colour scale for a figure's heatmaps (1 when none)."""
    finite = [abs(v) for grid in grids for row in grid for v in row if v is not None and not math.isnan(v)]
    return max(finite, default=0.0) or 1.0


def heatmap(
    values: list[list[float | None]],
    row_labels: list[str],
    col_labels: list[str],
    limit: float | None = None,
    cell: int = 36,
    label: str = "heatmap",
    scale: str = "",
    marks: list[tuple[float, str]] = (),
) -> str:
    """A diverging heatmap centred at zero, saturating at ``limit`` (pass one limit to every
    heatmap of a figure, :func:`shared_limit`; by default its own largest ``|value|``), with a
    colour bar captioned ``scale`` and ``marks`` on it (a random baseline), the value in each
    cell's tooltip and printed in it."""
    limit = limit or shared_limit(values)
    left, top = (
        8 + 7 * max((len(r) for r in row_labels), default=1),
        12 + 7 * max((len(c) for c in col_labels), default=1),
    )
    top = max(top, 24)  # room for the colour bar's caption
    parts = []
    for j, name in enumerate(col_labels):
        x = left + j * cell + cell / 2
        parts.append(_text(x, top - 4, esc(name), extra=f' transform="rotate(-60 {x} {top - 4})"'))
    for i, (name, row) in enumerate(zip(row_labels, values, strict=True)):
        y = top + i * cell
        parts.append(_text(left - 4, y + cell / 2 + 4, esc(name), "end"))
        for j, value in enumerate(row):
            tip = f"{row_labels[i]} → {col_labels[j]}: " + ("undefined" if value is None else f"{value:.4g}")
            parts.append(
                f'<rect x="{left + j * cell}" y="{y}" width="{cell - 1}" height="{cell - 1}" '
                f'fill="{diverging(value, limit)}"><title>{esc(tip)}</title></rect>'
            )
            if value is not None and cell >= 24:
                x, y_text = left + j * cell + cell / 2, y + cell / 2 + 3
                ink = ' fill="white"' if abs(value) > 0.6 * limit else ""  # readable on the saturated ends
                text = _cell_text(value, limit)
                parts.append(_text(x, y_text, text, "middle", f' pointer-events="none"{ink}', CELL_FONT))
    right = left + cell * len(col_labels) + 16
    bar_height = max(cell * len(row_labels), 100)
    parts += colour_bar(right + 40, top, bar_height, limit, scale, marks)
    width = right + 40 + max(60, 5 * len(scale))  # the bar's ticks, or its caption
    height = top + max(cell * len(row_labels), bar_height) + 8
    return _svg(width, height, parts, label)


def _cell_text(value: float, limit: float) -> str:
    """A cell's printed value to a hundredth of the colour scale's end ``limit`` (finer is noise at
    that scale; the tooltip has every digit), without trailing zeros or a leading zero: ``-.015``,
    ``.53``, ``27``, and ``0`` for what rounds to nothing."""
    decimals = max(0, math.ceil(-math.log10(limit / 100))) if limit > 0 else 2
    text = f"{value:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    if text in ("-0", "0", ""):
        return "0"
    return text.replace("0.", ".", 1) if text.lstrip("-").startswith("0.") else text


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
    marks: list[tuple[float, str]] = (),
) -> str:
    """Points ``{"x", "y", "label", "colour"?}``; the label is the tooltip; ``marks`` are dashed
    vertical lines ``(x, text)`` (a random baseline)."""
    axes = _Axes(x_range, y_range, width=width, height=height)
    parts = axes.frame(x_label, y_label) + _marks(axes, marks)
    if zero_lines:
        if axes.x0 < 0 < axes.x1:
            parts.append(_line(axes.x(0), axes.top, axes.x(0), axes.y(axes.y0), "#bbb"))
        if axes.y0 < 0 < axes.y1:
            parts.append(_line(axes.left, axes.y(0), axes.width - axes.right, axes.y(0), "#bbb"))
    for p in points:
        colour = p.get("colour", COLOURS[0])
        parts.append(
            f'<circle cx="{axes.x(p["x"]):.1f}" cy="{axes.y(p["y"]):.1f}" r="{radius}" fill="{colour}" '
            f'fill-opacity="0.75"><title>{esc(p.get("label", ""))}</title></circle>'
        )
        if p.get("text"):  # right of the point (left near the right edge), above it (below near the top)
            right = axes.x(p["x"]) > axes.width - 60
            x, anchor = axes.x(p["x"]) + (-6 if right else 6), "end" if right else "start"
            y = axes.y(p["y"]) + (14 if axes.y(p["y"]) < axes.top + 14 else -5)
            parts.append(_text(x, y, esc(p["text"]), anchor))
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
    parts = [_line(zero, 0, zero, row * len(items), "#444")]
    for i, (name, value) in enumerate(items):
        x = zero + min(0, value) * scale
        parts.append(_text(left - 4, i * row + 14, esc(name), "end"))
        parts.append(
            f'<rect x="{x:.1f}" y="{i * row + 3}" width="{abs(value) * scale:.1f}" height="{row - 6}" '
            f'fill="{COLOURS[0] if value >= 0 else COLOURS[1]}">'
            f"<title>{esc(name)}: {value:.4f}</title></rect>"
        )
        parts.append(_text(zero + max(0, value) * scale + 4, i * row + 14, f"{value:+.3f}"))
    parts.append(f'<text x="{left}" y="{row * len(items) + 16}" {FONT}>{esc(x_label)}</text>')
    return _svg(width, row * len(items) + 22, parts, label)


def _png(rows: list[list[tuple[int, int, int]]]) -> bytes:
    """An RGB PNG of pixel rows (top row first), written with the standard library's zlib."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", len(rows[0]), len(rows), 8, 2, 0, 0, 0)  # 8-bit RGB
    raw = b"".join(b"\x00" + bytes(c for pixel in row for c in pixel) for row in rows)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def saturation(values: list[float], share: float) -> float:
    """The colour scale's end that leaves ``share`` of the ``|values|`` unsaturated (1 when all 0)."""
    sizes = sorted(abs(v) for v in values)
    return sizes[int(share * (len(sizes) - 1))] or 1.0


def training_heatmap(
    tokens: list[float],
    columns: list[list[float]],
    x_label: str,
    y_label: str,
    marks: list[tuple[float, str]] = (),
    label: str = "heatmap over training",
    unsaturated: float = 0.95,
) -> tuple[str, float]:
    """One column of values per evaluation (``columns[i][row]``, row 0 at the bottom) on a log axis of
    training ``tokens`` (ascending), each coloured by :func:`diverging_rgb` against its own column's
    mean (red above it, blue below), the scale saturating where ``unsaturated`` of the cells stay
    inside it. Each pixel column shows the evaluation nearest in log tokens: the picture is a PNG
    embedded in the SVG, a few kB where one rectangle per cell would be hundreds. Returns the SVG
    and the scale's end (for the caption)."""
    centred = [[v - sum(column) / len(column) for v in column] for column in columns]
    limit = saturation([v for column in centred for v in column], unsaturated)
    axes = _Axes((tokens[0], tokens[-1]), (0, len(columns[0])), log_x=True, height=300)
    x = [math.log10(t) for t in tokens]
    edges = [(a + b) / 2 for a, b in zip(x, x[1:], strict=False)]
    width, height = round(axes.width - axes.left - axes.right), axes.y(0) - axes.top
    nearest = [bisect.bisect(edges, axes.x0 + (p + 0.5) / width * (axes.x1 - axes.x0)) for p in range(width)]
    rows = [[diverging_rgb(centred[c][i], limit) for c in nearest] for i in reversed(range(len(columns[0])))]
    png = base64.b64encode(_png(rows)).decode()
    image = (
        f'<image x="{axes.left}" y="{axes.top}" width="{width}" height="{height:.1f}" '
        f'preserveAspectRatio="none" style="image-rendering:pixelated" href="data:image/png;base64,{png}"/>'
    )
    parts = axes.frame(x_label, y_label) + [image] + _marks(axes, marks)  # the image hides the grid
    parts += colour_bar(axes.width + 24, axes.top + 12, height - 12, limit, "from the mean")
    return _svg(axes.width + 90, axes.height, parts, label), limit  # the bar right of the plot


def attention_grid(name: str, pattern: list[list[float]], strings: list[str] | None = None) -> str:
    """A head's attention pattern (rows: destination, columns: source), each token's label on both
    axes (when ``strings`` are given) and each weight in its cell's tooltip; weights under 0.02
    left blank. Cells of 8 to 20 pixels: a pattern stays readable at any length up to ``n_ctx``."""
    n = len(pattern)
    cell = max(8, min(20, 400 // max(n, 1)))
    names = [f"{i} {strings[i]}" if strings else str(i) for i in range(n)]
    font = f'font-family="system-ui, sans-serif" font-size="{min(cell - 1, 11)}"'
    room = 6 + min(cell - 1, 11) * 0.6 * max((len(t) for t in names), default=1)
    left, top = room, room
    parts = [
        f'<rect x="{left}" y="{top}" width="{n * cell}" height="{n * cell}" fill="white" stroke="#ccc"/>'
    ]
    for i, text in enumerate(names):
        centre = i * cell + cell / 2
        parts.append(_text(left - 3, top + centre + cell / 3, esc(text), "end", font=font))
        x = left + centre + cell / 3
        parts.append(
            _text(x, top - 3, esc(text), extra=f' transform="rotate(-90 {x:.1f} {top - 3})"', font=font)
        )
    for dest, row in enumerate(pattern):
        for src, w in enumerate(row):
            if w > 0.02:
                tip = f"{name}: {names[dest]} attends to {names[src]}: {w:.3f}"
                parts.append(
                    f'<rect x="{left + src * cell}" y="{top + dest * cell}" width="{cell}" height="{cell}" '
                    f'fill="{sequential(w)}"><title>{esc(tip)}</title></rect>'
                )
    size = left + n * cell + 4
    return _svg(size, size, parts, f"pattern {name}").replace('class="figure"', 'class="figure pattern"', 1)


def attention_scale() -> str:
    """The colour bar of :func:`attention_grid`: attention weights from 0 (white) to 1."""
    bar = colour_bar(4, 16, 120, 1.0, "attention weight", colour=sequential, low=0.0)
    return _svg(70, 146, bar, "attention colour scale")


EDGE_COLOURS = {"Q": "#1f77b4", "K": "#d62728", "V": "#2ca02c"}


def circuit_diagram(
    layers: list[list[tuple[str, str]]], edges: list[tuple[str, str, str, float]], label: str = "circuit"
) -> str:
    """A layered graph: ``layers[l]`` the nodes of layer ``l`` as ``(name, caption)``, drawn from
    the bottom (layer 0) up; ``edges`` as ``(writer, reader, kind, weight)``, coloured by kind
    (:data:`EDGE_COLOURS`), as wide as ``|weight|`` (dashed when negative), each with a tooltip."""
    gap, row, margin = 96, 90, 40
    width = 2 * margin + gap * max((len(nodes) for nodes in layers), default=1)
    height = 2 * margin + row * max(len(layers) - 1, 0) + 20
    where = {}
    for layer, nodes in enumerate(layers):
        for i, (name, _) in enumerate(nodes):
            where[name] = (margin + gap * (i + 0.5), height - margin - row * layer)
    offsets = {"Q": -10.0, "K": 0.0, "V": 10.0}  # the three kinds side by side into a reader
    parts = []
    for writer, reader, kind, weight in edges:
        (x1, y1), (x2, y2) = where[writer], where[reader]
        dash = ' stroke-dasharray="5 3"' if weight < 0 else ""
        extra = f' stroke-width="{0.8 + 5 * min(abs(weight), 1.0):.1f}" stroke-opacity="0.75"{dash}'
        tip = f"<title>{esc(writer)} → {esc(reader)} {kind}: {weight:+.2f}</title>"
        line = _line(x1, y1 - 12, x2 + offsets[kind], y2 + 30, EDGE_COLOURS[kind], extra)  # below the caption
        parts.append(line.replace("/>", f">{tip}</line>"))
    for nodes in layers:
        for name, caption in nodes:
            x, y = where[name]
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="12" fill="#f4f4f4" stroke="#333"/>')
            parts.append(_text(x, y + 4, esc(name), "middle", font=SMALL_FONT))
            parts.append(_text(x, y + 24, esc(caption), "middle", extra=' fill="#555"', font=SMALL_FONT))
    for kind, colour in EDGE_COLOURS.items():
        x = 10 + 110 * list(EDGE_COLOURS).index(kind)
        parts.append(_line(x, 14, x + 20, 14, colour, ' stroke-width="3"'))
        parts.append(_text(x + 24, 18, f"{kind}-composition"))
    return _svg(max(width, 340), height, parts, label)
