"""``messages.png``: the sequence diagram of a run's first steps, drawn.

One lane per rank, top to bottom, the nodes apart; time across, in milliseconds from the
first worker's first step. On each lane the step's phases are boxes (compute tall,
communication and waiting flat, a server's idle time faint), each step's start a tick
with its number above the lane, each decision a black triangle with its words below.
Every message, and every rank's part of a collective, is an arrow from the moment it
left to the moment its receiver had it, labelled with what moved and its bytes: teal
inside a node, black between nodes (a rail), dashed for a collective. The data is
:func:`minidp.reporting.sequence.sequence`'s; this module only draws it.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only: no display is needed or wanted
import matplotlib.pyplot as plt  # noqa: E402 (after the backend is chosen)
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle  # noqa: E402

from minidp.reporting.plots import PHASE_COLOURS  # noqa: E402
from minidp.reporting.sequence import COMPUTE, Diagram, size_text  # noqa: E402

COLOURS = {**PHASE_COLOURS, "post": "0.45", "idle": "0.88"}  # the phases as ranks.png has them
# Apart from every phase's colour: teal inside a node, near-black across nodes.
LEVEL_COLOURS = {"intra": "#0e9aa7", "inter": "#202020"}
LEVEL_WORDS = {"intra": "inside a node", "inter": "between nodes (rail)"}
NODE_GAP = 0.6  # extra room between the lanes of two nodes
TALL, FLAT = 0.34, 0.14  # box heights: compute, communication


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


class _Labels:
    """Places small texts where no earlier one is: the first free of a few candidates.

    Sizes are estimated from the font (a character is about 0.55 of its size wide), in
    data units through the axes' size in inches, which is all the overlap test needs.
    """

    def __init__(self, ax: plt.Axes, fig: Figure, fontsize: float) -> None:
        width, height = fig.get_size_inches()
        box = ax.get_position()
        (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
        self.per_x = (x1 - x0) / (width * box.width)  # data units per inch
        self.per_y = (y1 - y0) / (height * box.height)
        self.fontsize, self.placed = fontsize, []

    def size(self, text: str) -> tuple[float, float]:
        """(width, height) of ``text`` (lines apart at a newline) in data units."""
        lines = text.split("\n")
        return (max(map(len, lines)) * self.fontsize * 0.55 / 72 * self.per_x,
                len(lines) * self.fontsize * 1.3 / 72 * self.per_y)

    def place(self, text: str, candidates: list[tuple[float, float]]) -> tuple[float, float]:
        """The first candidate centre where ``text`` overlaps no placed text (else the first)."""
        w, h = self.size(text)
        for x, y in candidates:
            if not any(abs(x - px) < (w + pw) / 2 and abs(y - py) < (h + ph) / 2
                       for px, py, pw, ph in self.placed):
                break
        else:
            x, y = candidates[0]
        self.placed.append((x, y, w, h))
        return x, y


def draw(diagram: Diagram, title: str) -> Figure:
    """The figure of ``diagram`` (the caller saves it)."""
    rows = _rows(diagram)
    length = max(diagram.length, 1e-3)
    height = 1.6 + 1.05 * (max(rows.values()) - min(rows.values()) + 1)
    fig, ax = plt.subplots(figsize=(16, height))
    fig.subplots_adjust(left=0.1, right=0.86, top=0.9, bottom=0.14)
    ax.set_xlim(-0.01 * length, 1.01 * length)
    ax.set_ylim(min(rows.values()) - 0.9, max(rows.values()) + 0.8)
    labels = _Labels(ax, fig, 6)
    nodes = {lane.rank: lane.node for lane in diagram.lanes}
    said: dict[tuple, float] = {}

    def repeated(key: tuple, at: float) -> bool:
        """Whether the text ``key`` was written within 2% of the diagram before ``at``."""
        before = said.get(key)
        said[key] = at
        return before is not None and abs(at - before) <= 0.02 * length
    for lane in diagram.lanes:
        ax.axhline(rows[lane.rank], color="0.8", lw=0.6, zorder=0)
    for box in diagram.boxes:
        tall = box.phase in COMPUTE
        h = TALL if tall else FLAT
        ax.add_patch(Rectangle((box.start, rows[box.rank] - h / 2), box.end - box.start, h,
                               color=COLOURS.get(box.phase, "0.6"), lw=0,
                               alpha=0.9 if tall else 0.75, zorder=1))
    for rank, step, at in diagram.step_starts:
        y = rows[rank]
        ax.plot([at, at], [y - 0.3, y + 0.3], color="0.25", lw=0.8, zorder=2)
        ax.text(at, y + 0.32, f"step {step}", fontsize=7, ha="left", va="bottom", color="0.25")
    for arrow in diagram.arrows:
        colour = LEVEL_COLOURS[arrow.level]
        (x0, y0), (x1, y1) = (arrow.sent, rows[arrow.source]), (arrow.arrived, rows[arrow.dest])
        ax.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="-|>", mutation_scale=9,
                                     color=colour, lw=0.9, zorder=4, shrinkA=0, shrinkB=0,
                                     linestyle="--" if arrow.kind == "collective" else "-"))
        # A collective's parts into one root (or out of one source) say the same: one
        # label for them all.
        text = f"{arrow.what} {size_text(arrow.nbytes)}"
        hub = arrow.dest if arrow.kind == "collective" else None
        if hub is not None and repeated(("arrow", hub, text), arrow.arrived):
            continue
        # Along the arrow, nearer the sender first: a reply crossing its request (a pull
        # and its answer, the parameters and the centre) keeps a label of its own.
        x, y = labels.place(text, [(x0 + f * (x1 - x0), y0 + f * (y1 - y0))
                                   for f in (1 / 3, 1 / 2, 2 / 3, 1 / 5, 4 / 5)])
        ax.text(x, y, text, fontsize=6, ha="center", va="center", color=colour, zorder=5,
                bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none",
                      "alpha": 0.8})
    for marker in diagram.markers:
        y = rows[marker.rank]
        ax.plot(marker.time, y - 0.2, marker="v", color="black", markersize=5, zorder=6)
        # The same decision on every rank of a node (DASO's are the node's): said once.
        if repeated(("marker", nodes[marker.rank], marker.text), marker.time):
            continue
        # Below the lane, its top under the triangle; lower where another text is there.
        lines = marker.text.count("\n") + 1
        x, y_text = labels.place(marker.text, [(marker.time, y - 0.3 - 0.055 * lines - 0.13 * k)
                                               for k in range(4)])
        ax.text(x, y_text, marker.text, fontsize=6, ha="center", va="center", zorder=6)
    ax.set_yticks([rows[lane.rank] for lane in diagram.lanes],
                  [lane.name for lane in diagram.lanes])
    ax.set_xlabel("ms from the first worker's step 1 (a real run: times are this machine's)")
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
    return fig


def save(diagram: Diagram, title: str, path: str) -> None:
    """Draw ``diagram`` into the PNG file ``path``."""
    fig = draw(diagram, title)
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
