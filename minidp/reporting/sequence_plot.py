"""``messages.png``: the sequence diagram of a run's first steps, drawn.

One lane per rank, top to bottom, the nodes apart; time across, in milliseconds from the
first worker's first step. On each lane the step's phases are boxes (compute tall,
communication and waiting flat, a server's idle time faint), each step's start a tick
with its number above the lane, each decision a black triangle with its words below.
Every message, and every rank's part of a collective, is an arrow from the moment it
left to the moment its receiver had it, labelled with what moved and its bytes: teal
inside a node, black between nodes (a rail), dashed for a collective. The data is
:func:`minidp.reporting.sequence.sequence`'s; this module only draws it.

Two things keep every word readable however crowded the run. Where nothing happens for
long the time axis is drawn shorter, logarithmically, a mark on the axis there
(:class:`_Clock`): one rank's stall on a loaded machine takes less of the page from the
messages. And each text goes where no other is, measured by the renderer that saves the
figure (:class:`_Labels`); a text with no free place gets a number there and its words
in a key under the plot.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed or wanted
import matplotlib.pyplot as plt  # noqa: E402 (after the backend is chosen)
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from minidp.reporting.plots import PHASE_COLOURS  # noqa: E402
from minidp.reporting.sequence import COMPUTE, Diagram, size_text  # noqa: E402

COLOURS = {**PHASE_COLOURS, "post": "0.45", "idle": "0.88"}  # the phases as ranks.png has them
# Apart from every phase's colour: teal inside a node, near-black across nodes.
LEVEL_COLOURS = {"intra": "#0e9aa7", "inter": "#202020"}
LEVEL_WORDS = {"intra": "inside a node", "inter": "between nodes (rail)"}
NODE_GAP = 0.6  # extra room between the lanes of two nodes
TALL, FLAT = 0.34, 0.14  # box heights: compute, communication
DPI = 110  # drawn and saved at one resolution: the texts' measured sizes are the saved ones
PAD = 2.0  # pixels kept free around a text (its white box reaches 1.4 beyond the letters)
# A stretch with nothing in it longer than SHORT of the run is drawn SHORT long, plus
# SHORT times the log of how many times longer it is: still longer than a short one.
SHORT = 0.05
ALONG = (1 / 3, 1 / 2, 2 / 3, 1 / 5, 4 / 5, 1 / 10, 9 / 10)  # places on an arrow, in order
WHITE = {"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85}  # behind
TOUCHING = 12  # pixels: one rank's triangles nearer than this share one text
# A number's places when its words' are all taken: rings ever wider around its spot.
RING = ((0, -1), (1, 0), (-1, 0), (0, 1), (1, -1), (-1, -1), (1, 1), (-1, 1))


class _Clock:
    """Where a moment (ms) is drawn: time as it ran, each long empty stretch shortened.

    The moments are every box's ends, every arrow's ends, every decision and step start;
    between two neighbours time is drawn linearly, so nothing crosses or changes order.
    """

    def __init__(self, diagram: Diagram) -> None:
        moments = {0.0, diagram.length}
        for box in diagram.boxes:
            moments |= {box.start, box.end}
        for arrow in diagram.arrows:
            moments |= {arrow.sent, arrow.arrived}
        moments |= {m.time for m in diagram.markers}
        moments |= {at for _, _, at in diagram.step_starts}
        self.real = np.array(sorted(moments))
        short = SHORT * max(diagram.length, 1e-3)
        gaps = np.diff(self.real)
        drawn = [g if g <= short else short * (1 + math.log(g / short)) for g in gaps]
        self.drawn = np.concatenate([[0.0], np.cumsum(drawn)])
        # the shortened stretches, drawn: where the axis gets its break mark
        self.breaks = [(a + b) / 2 for a, b, g in zip(self.drawn, self.drawn[1:], gaps)
                       if g > short]
        self.length = float(self.drawn[-1])

    def __call__(self, ms: float) -> float:
        return float(np.interp(ms, self.real, self.drawn))

    def ticks(self, count: int = 9) -> tuple[list[float], list[str]]:
        """``count`` ticks evenly across the page, each labelled with its real time."""
        places = np.linspace(0.0, self.length, count)
        times = np.interp(places, self.drawn, self.real)
        digits = max(0, 2 - math.floor(math.log10(max(self.real[-1], 1e-3))))
        return list(places), [f"{t:.{digits}f}" for t in times]


class _Labels:
    """Writes each text at the first of its candidate places where no earlier text is.

    A text's box is measured by the Agg renderer that saves the figure (the figure's size,
    limits and resolution are final before the first text), so what is free here is free
    in the file. A text stays inside the plot's frame (off the legend beside it); ``keep``
    reserves a box (a triangle) no text may cover.
    """

    def __init__(self, fig: Figure, ax: plt.Axes) -> None:
        self.ax, self.renderer = ax, fig.canvas.get_renderer()
        self.taken: list[Bbox] = []
        x0, x1 = ax.get_xlim()
        (y0, y1), self.frame = ax.get_ylim(), ax.get_window_extent(self.renderer)
        self.pixel = (x1 - x0) / self.frame.width  # data units per pixel, across
        self.pixel_y = (y1 - y0) / self.frame.height  # and up

    def keep(self, box: Bbox) -> None:
        self.taken.append(box)

    def place(self, text: str, candidates: list[tuple[float, float, str]],
              **style) -> Text | None:
        """The text at its first free candidate ``(x, y, ha)``; None (nothing drawn) if none."""
        label = self.ax.text(0.0, 0.0, text, **style)
        for x, y, ha in candidates:
            label.set_position((x, y))
            label.set_horizontalalignment(ha)
            box = label.get_window_extent(self.renderer).padded(PAD)
            inside = (self.frame.x0 <= box.x0 and box.x1 <= self.frame.x1
                      and self.frame.y0 <= box.y0 and box.y1 <= self.frame.y1)
            if inside and not any(box.overlaps(other) for other in self.taken):
                self.taken.append(box)
                return label
        label.remove()
        return None

    def along(self, start: tuple[float, float], end: tuple[float, float],
              fractions: tuple[float, ...] = ALONG) -> list[tuple[float, float, str]]:
        """Places for an arrow's text: on it (its white box hides the line), then beside it."""
        (x0, y0), (x1, y1) = start, end
        points = [(x0 + f * (x1 - x0), y0 + f * (y1 - y0)) for f in fractions]
        gap = 3 * self.pixel
        return ([(x, y, "center") for x, y in points] + [(x + gap, y, "left") for x, y in points]
                + [(x - gap, y, "right") for x, y in points])

    def around(self, x: float, y: float) -> list[tuple[float, float, str]]:
        """Places for a number near ``(x, y)``: rings 8 pixels apart, up to 80 away."""
        return [(x + r * dx * self.pixel, y + r * dy * self.pixel_y, "center")
                for r in range(8, 81, 8) for dx, dy in RING]


def _rows(diagram: Diagram) -> dict[int, float]:
    """Each rank's lane height, top lane highest, a gap where the node changes."""
    y, rows, node = 0.0, {}, None
    for lane in diagram.lanes:
        if node is not None and lane.node != node:
            y -= NODE_GAP
        rows[lane.rank] = y
        y -= 1.0
        node = lane.node
    return rows


def _decisions(diagram: Diagram, clock: _Clock,
               touching: float) -> list[tuple[int, float, str]]:
    """``(rank, x, text)`` of each text under the triangles, left to right.

    One rank's triangles drawn closer than ``touching`` (page units) share one text, their
    words one per line in time order: texts side by side could not tell whose they are.
    """
    texts: list[tuple[int, float, str]] = []
    last: dict[int, float] = {}
    for marker in sorted(diagram.markers, key=lambda m: (m.rank, m.time)):
        x = clock(marker.time)
        if marker.rank in last and x - last[marker.rank] < touching:
            rank, first, text = texts[-1]
            texts[-1] = (rank, first, f"{text}\n{marker.text}")
        else:
            texts.append((marker.rank, x, marker.text))
        last[marker.rank] = x
    return sorted(texts, key=lambda t: t[1])


def draw(diagram: Diagram, title: str) -> Figure:
    """The figure of ``diagram`` (the caller saves it, at ``DPI``)."""
    rows = _rows(diagram)
    clock = _Clock(diagram)
    length = max(clock.length, 1e-3)
    height = 1.6 + 1.5 * (max(rows.values()) - min(rows.values()) + 1)
    fig, ax = plt.subplots(figsize=(16, height), dpi=DPI)
    fig.subplots_adjust(left=0.1, right=0.86, top=0.9, bottom=0.14)
    ax.set_xlim(-0.01 * length, 1.01 * length)
    ax.set_ylim(min(rows.values()) - 0.9, max(rows.values()) + 0.8)
    labels = _Labels(fig, ax)
    nodes = {lane.rank: lane.node for lane in diagram.lanes}
    for lane in diagram.lanes:
        ax.axhline(rows[lane.rank], color="0.8", lw=0.6, zorder=0)
    for box in diagram.boxes:
        tall = box.phase in COMPUTE
        h = TALL if tall else FLAT
        start = clock(box.start)
        ax.add_patch(Rectangle((start, rows[box.rank] - h / 2), clock(box.end) - start, h,
                               color=COLOURS.get(box.phase, "0.6"), lw=0,
                               alpha=0.9 if tall else 0.75, zorder=1))
    # (where, the key's words, the number's places, its style) of each text without room
    unplaced: list[tuple[float, str, list, dict]] = []
    for rank, step, at in diagram.step_starts:
        x, y = clock(at), rows[rank]
        ax.plot([x, x], [y - 0.3, y + 0.3], color="0.25", lw=0.8, zorder=2)
        above = [(x, y + 0.32 + 0.12 * k, "left") for k in range(3)]
        style = {"fontsize": 7, "va": "bottom", "color": "0.25"}
        if labels.place(f"step {step}", above, **style) is None:
            unplaced.append((x, f"rank {rank}: step {step} starts",
                             above + labels.around(x, y + 0.32), style))
    for marker in diagram.markers:  # every triangle first: no text covers one
        x, y = clock(marker.time), rows[marker.rank] - 0.2
        ax.plot(x, y, marker="v", color="black", markersize=5, zorder=6)
        centre = ax.transData.transform((x, y))
        labels.keep(Bbox.from_bounds(centre[0] - 4, centre[1] - 4, 8, 8))
    said: dict[tuple, float] = {}

    def repeated(key: tuple, at: float) -> bool:
        """Whether the text ``key`` was written within 2% of the page before ``at``."""
        before = said.get(key)
        said[key] = at
        return before is not None and abs(at - before) <= 0.02 * length

    for rank, x, text in _decisions(diagram, clock, TOUCHING * labels.pixel):
        y = rows[rank]
        # The same decision on every rank of a node (DASO's are the node's): said once.
        if repeated(("marker", nodes[rank], text), x):
            continue
        # Below the triangle, centred, else starting or ending at it; lower where taken.
        below = [(x, y - 0.3 - 0.12 * k, ha) for k in range(4)
                 for ha in ("center", "left", "right")]
        style = {"fontsize": 6, "va": "top", "zorder": 7, "bbox": WHITE}
        if labels.place(text, below, **style) is None:
            unplaced.append((x, f"rank {rank}: {text.replace(chr(10), '; ')}",
                             below + labels.around(x, y - 0.3), style))
    for arrow in diagram.arrows:
        colour = LEVEL_COLOURS[arrow.level]
        start = (clock(arrow.sent), rows[arrow.source])
        end = (clock(arrow.arrived), rows[arrow.dest])
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=9,
                                     color=colour, lw=0.9, zorder=4, shrinkA=0, shrinkB=0,
                                     linestyle="--" if arrow.kind == "collective" else "-"))
        # A collective's parts into one root (or out of one source) say the same: one
        # label for them all.
        text = f"{arrow.what} {size_text(arrow.nbytes)}"
        hub = arrow.dest if arrow.kind == "collective" else None
        if hub is not None and repeated(("arrow", hub, text), end[0]):
            continue
        # On the arrow, nearer the sender first: a reply crossing its request (a pull and
        # its answer, the parameters and the centre) keeps a label of its own.
        style = {"fontsize": 6, "va": "center", "color": colour, "zorder": 5,
                 "bbox": WHITE}
        places = labels.along(start, end)
        if labels.place(text, places, **style) is None:
            middle = ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2)
            unplaced.append((start[0], f"{text}, rank {arrow.source} → {arrow.dest}",
                             places + labels.around(*middle), style))
    ticks, words = clock.ticks()
    ax.set_xticks(ticks, words)
    for x in clock.breaks:  # a broken-axis mark on each shortened stretch
        ax.plot(x, 0, marker=r"$\approx$", markersize=7, color="0.25", clip_on=False, zorder=8,
                transform=ax.get_xaxis_transform())
    ax.set_yticks([rows[lane.rank] for lane in diagram.lanes],
                  [lane.name for lane in diagram.lanes])
    ax.set_xlabel("ms from the first worker's step 1 (a real run: times are this machine's; "
                  "≈ on the axis: a long stretch drawn shorter)")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title(title, loc="left", fontsize=10)
    shown = sorted({b.phase for b in diagram.boxes}, key=list(COLOURS).index)
    handles = [Patch(color=COLOURS[p], label=p) for p in shown]
    handles += [Line2D([], [], color=LEVEL_COLOURS[level], label=f"message {words}")
                for level, words in LEVEL_WORDS.items()]
    handles += [Line2D([], [], color="0.3", ls="--", label="part of a collective"),
                Line2D([], [], color="black", marker="v", ls="", label="decision")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7,
              frameon=False)
    _key(fig, ax, labels, sorted(unplaced, key=lambda u: u[0]))
    return fig


def _key(fig: Figure, ax: plt.Axes, labels: _Labels,
         unplaced: list[tuple[float, str, list, dict]]) -> None:
    """Number each text that found no free place, left to right, and list them under the plot.

    The numbers go where the words did not fit; the key's entries are in columns as wide
    as the widest, below the axis' words (measured, as the labels are).
    """
    entries = []
    for number, (_, words, candidates, style) in enumerate(unplaced, 1):
        # Nowhere free even for a number (not yet seen: a number is small): its first place.
        if labels.place(str(number), candidates, **{**style, "fontweight": "bold"}) is None:
            x, y, ha = candidates[0]
            ax.text(x, y, str(number), ha=ha, **{**style, "fontweight": "bold"})
        entries.append(fig.text(0, 0, f"{number}: {words}", fontsize=6,
                                color=style.get("color", "black")))
    if not entries:
        return
    renderer = labels.renderer
    top = ax.get_tightbbox(renderer).y0 - 8  # pixels, under the tick labels and words
    sizes = [e.get_window_extent(renderer) for e in entries]
    width, line = max(s.width for s in sizes) + 12, max(s.height for s in sizes) + 2
    columns = max(1, int(labels.frame.width // width))
    for k, entry in enumerate(entries):
        row, column = divmod(k, columns)
        entry.set_position(fig.transFigure.inverted().transform(
            (labels.frame.x0 + column * width, top - (row + 1) * line)))


def save(diagram: Diagram, title: str, path: str) -> None:
    """Draw ``diagram`` into the PNG file ``path``."""
    fig = draw(diagram, title)
    try:
        fig.savefig(path, dpi=DPI, bbox_inches="tight")
    finally:
        plt.close(fig)
