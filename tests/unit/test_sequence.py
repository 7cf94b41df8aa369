"""The sequence diagram's data: lanes, steps, arrows and decisions of a trace, and its report.

The trace is made by the tracers and arrows of three ranks playing a small parameter
server in one process (rank 0 serves, rank 1 on its node, rank 2 on another), so its
events are the ones a run records; what the diagram must show is known by construction.
"""

import contextlib
import json
import os

import pytest

from minidp.__main__ import main
from minidp.comm.arrows import Arrows, Group
from minidp.reporting.readback import Unreadable
from minidp.reporting.report import write_report
from minidp.reporting.runs import label_runs, load_run
from minidp.reporting.sequence import (
    Arrow,
    Box,
    Diagram,
    Lane,
    Marker,
    NoSteps,
    sequence,
    size_text,
)
from minidp.trace import Tracer, chrome_trace, set_tracer, tracer

pytest.importorskip("matplotlib")
import matplotlib.pyplot as plt  # noqa: E402 (after the skip)

from minidp.reporting import sequence_plot  # noqa: E402

LANES = {0: ("node 0 / rank 0 (server)", 0), 1: ("node 0 / rank 1", 1),
         2: ("node 1 / rank 2", 5)}
PARAMETERS = 4000


@pytest.fixture(autouse=True)
def own_tracer():
    before = tracer()
    yield
    set_tracer(before)


class Run:
    """Three ranks' tracers and arrows; ``rank(r)`` makes r's tracer the current one."""

    def __init__(self):
        self.tracers = {r: Tracer(r, LANES[r]) for r in LANES}
        # One clock for the three: each tracer reads time.time() and perf_counter() when
        # made, a few microseconds apart (more on a loaded machine), and this play's
        # events are microseconds apart too: apart, the clocks could reorder them.
        for t in self.tracers.values():
            t.origin, t.unix_us = self.tracers[0].origin, self.tracers[0].unix_us
        # Each rank's own groups (each process counts its collectives itself).
        self.arrows = {0: Arrows(0, {"world": Group("world", [0, 1, 2])}),
                       **{r: Arrows(r, {"world": Group("world", [0, 1, 2]),
                                        "rail": Group("rail 0", [1, 2])}) for r in (1, 2)}}

    @contextlib.contextmanager
    def rank(self, r, phase=None, **args):
        set_tracer(self.tracers[r])
        if phase is None:
            yield self.arrows[r]
            return
        with self.tracers[r].phase(phase, **args):
            yield self.arrows[r]

    def message(self, source, dest, tag, what, nbytes):
        with self.rank(source, "comm_intra" if {source, dest} == {0, 1} else "comm_inter") \
                as a:
            a.message_sent(dest, tag, what, nbytes)
        with self.rank(dest, "wait") as a:
            a.message_received(source, tag)

    def step(self, worker, step, version):
        with self.rank(worker):
            tracer().begin_step(step)
        self.message(worker, 0, 201, "pull", 32)
        self.message(0, worker, 202, "parameters", PARAMETERS)
        with self.rank(worker, "forward"):
            pass
        self.message(worker, 0, 205, "push gradient", PARAMETERS)
        with self.rank(0, "optimizer"):
            tracer().mark("server update", worker=worker, staleness=version % 2, lr=0.05,
                          version=version)

    def events(self):
        return chrome_trace([self.tracers[r].finish() for r in sorted(LANES)])["traceEvents"]


def played(steps=4, rail=True):
    run = Run()
    version = 0
    for s in range(1, steps + 1):
        for w in (1, 2):
            version += 1
            run.step(w, s, version)
        if rail and s == 2:  # both workers in a collective on their rail, in step 2
            parts = []
            for w in (2, 1):  # rank 2 enters first: its part leaves before the root leaves
                set_tracer(run.tracers[w])
                phase = run.tracers[w].phase("comm_inter")
                phase.__enter__()
                drawn = run.arrows[w].collective("rail", "rail sum", 64)
                drawn.__enter__()
                parts.append((w, phase, drawn))
            for w, phase, drawn in parts:
                set_tracer(run.tracers[w])
                drawn.__exit__(None, None, None)
                phase.__exit__(None, None, None)
    for w in (1, 2):  # the epoch's end: step 5 marked, asked for, not taken; then taken
        with run.rank(w):
            tracer().begin_step(steps + 1)
    return run


def test_the_arrows_are_the_messages_of_the_first_steps_with_their_steps_and_levels():
    d = sequence(played().events(), steps=2)
    assert [(lane.rank, lane.node) for lane in d.lanes] == [(0, 0), (1, 0), (2, 1)]
    got = [(a.source, a.dest, a.step, a.what, a.nbytes, a.level, a.kind) for a in d.arrows]
    expected = []
    for s in (1, 2):
        for w in (1, 2):
            level = "intra" if w == 1 else "inter"
            expected += [(w, 0, s, "pull", 32, level, "p2p"),
                         (0, w, s, "parameters", PARAMETERS, level, "p2p"),
                         (w, 0, s, "push gradient", PARAMETERS, level, "p2p")]
    expected.append((2, 1, 2, "rail sum", 64, "inter", "collective"))  # into the rail's root
    assert got == expected
    assert all(a.sent <= a.arrived for a in d.arrows)
    # the decisions of those steps, the server's, in its words
    assert [m.text for m in d.markers] == [f"v{v}: stale {v % 2}, lr 0.05" for v in range(1, 5)]
    assert {(r, s) for r, s, _ in d.step_starts} == {(1, 1), (1, 2), (2, 1), (2, 2)}
    assert {b.phase for b in d.boxes} >= {"forward", "optimizer", "wait", "comm_intra"}


def test_a_step_marked_twice_at_an_epochs_end_is_the_one_that_ran():
    run = played(steps=2, rail=False)
    for w in (1, 2):  # the next epoch's first step: marked again, with the same number
        run.step(w, 3, 10 + w)
    d = sequence(run.events(), steps=3)
    third = [a for a in d.arrows if a.step == 3]
    assert [(a.source, a.dest, a.what) for a in third] == [
        (1, 0, "pull"), (0, 1, "parameters"), (1, 0, "push gradient"),
        (2, 0, "pull"), (0, 2, "parameters"), (2, 0, "push gradient")]
    assert sorted(s for r, s, _ in d.step_starts if r == 1) == [1, 2, 3]


def test_a_trace_without_steps_or_with_a_bad_event_is_named():
    events = played().events()
    with pytest.raises(NoSteps, match="no step marks"):
        sequence([e for e in events if e["name"] != "step"])
    broken = [dict(e) for e in events]
    k = next(i for i, e in enumerate(broken) if e["ph"] == "s")
    broken[k]["ts"] = "soon"
    with pytest.raises(Unreadable, match=rf"trace.json, event {k}: 'ts' is \"soon\""):
        sequence(broken)
    k = next(i for i, e in enumerate(events) if e["name"] == "server update")
    events[k]["args"].pop("lr")
    with pytest.raises(Unreadable, match=rf"event {k}: the decision 'server update' lacks"):
        sequence(events)
    with pytest.raises(ValueError, match="--steps: got 0, allowed: an int >= 1"):
        sequence(events, 0)


def test_sizes_are_written_short():
    assert [size_text(n) for n in (812, 3100, 2143272)] == ["812 B", "3.1 kB", "2.14 MB"]


def run_directory(path, events):
    os.makedirs(path)
    with open(os.path.join(path, "run.json"), "w") as f:
        json.dump({"config": {"strategy": "asgd", "epochs": 1}}, f)
    with open(os.path.join(path, "metrics.jsonl"), "w") as f:
        f.write(json.dumps({"epoch": 1, "train_loss": 1.0, "test_loss": 1.0,
                            "test_accuracy": 0.5, "wall_s": 1.0}) + "\n")
    with open(os.path.join(path, "trace.json"), "w") as f:
        json.dump({"traceEvents": events}, f)
    return str(path)


def test_report_draws_messages_png_for_each_run_and_says_why_one_has_none(tmp_path):
    events = played().events()
    one = run_directory(tmp_path / "one", events)
    runs = [load_run(one)]
    label_runs(runs)
    out = tmp_path / "report"
    text = open(write_report(runs, str(out), 2)).read()
    assert "## Who sends what to whom: the first 2 steps" in text
    assert "(messages.png)" in text
    with open(out / "messages.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    old = run_directory(tmp_path / "old", [e for e in events if e["name"] != "step"])
    runs = [load_run(one), load_run(old)]
    label_runs(runs)
    text = open(write_report(runs, str(tmp_path / "two"))).read()
    assert os.path.exists(tmp_path / "two" / "messages-1.png")
    assert not os.path.exists(tmp_path / "two" / "messages-2.png")
    assert "asgd #2: trace.json has no step marks" in text


def test_report_refuses_a_bad_trace_before_writing_and_a_bad_steps(tmp_path, capsys):
    events = played().events()
    k = next(i for i, e in enumerate(events) if e["ph"] == "f")
    events[k]["pid"] = -1
    bad = run_directory(tmp_path / "bad", events)
    out = tmp_path / "report"
    assert main(["report", bad, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (f"error: report: {bad}/trace.json, event {k}: 'pid' "
                                       "is -1 (int), allowed: an int >= 0\n")
    assert not out.exists()
    assert main(["report", bad, "--out", str(out), "--steps", "11"]) == 2
    assert "--steps: got '11', allowed: an int from 1 to 10" in capsys.readouterr().err


def dense():
    """A diagram crowded as DASO's warm-up on a loaded machine: four ranks on two nodes,
    in each of three 2 ms steps every rank sends on its node and its rail and decides
    three things at once, and rank 1 stalls 300 ms in step 2's update."""
    lanes = [Lane(r, f"node {r // 2} / rank {r}", r // 2, r) for r in range(4)]
    boxes, arrows, markers, starts = [], [], [], []
    t = 0.0
    for step in (1, 2, 3):
        for r in range(4):
            starts.append((r, step, t))
            boxes.append(Box(r, "forward", t, t + 0.8))
        for k, (source, dest, what, nbytes, level) in enumerate([
                (1, 0, "node mean", 2143272, "intra"), (3, 2, "node mean", 2143272, "intra"),
                (2, 0, "rail sum", 1071636, "inter"), (3, 1, "rail sum", 1071636, "inter"),
                (0, 1, "replica sync", 0, "intra"), (2, 3, "replica sync", 0, "intra"),
                (0, 2, "rail sum", 1071636, "inter"), (1, 3, "allreduce", 36, "inter")]):
            sent = t + 0.9 + 0.1 * k
            arrows.append(Arrow(source, dest, step, what, nbytes, sent, sent + 0.15, level,
                                "collective"))
        for r in range(4):
            markers.append(Marker(r, t + 1.8, step, f"send rail {r % 2}, B,S,L=4,1,{r}\n"
                                  f"average rail {r % 2}\nbcast from {r}"))
        stall = 300.0 if step == 2 else 0.0
        boxes += [Box(r, "optimizer", t + 1.9, t + 2.0 + (stall if r == 1 else 0))
                  for r in range(4)]
        t += 2.0 + stall
    return Diagram(3, lanes, boxes, arrows, sorted(markers, key=lambda m: m.time), starts,
                   0.0, t)


def drawn_texts(fig):
    """Every text drawn on the diagram, under it and in its legend, with its box on the page
    (pixels): the white box behind it where it has one."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    texts = [t for t in [*ax.texts, *fig.texts, *ax.get_legend().get_texts()] if t.get_text()]
    return [(t.get_text(), (t.get_bbox_patch() or t).get_window_extent(renderer))
            for t in texts]


def test_no_two_labels_of_a_crowded_diagram_overlap_and_every_fact_is_written():
    fig = sequence_plot.draw(dense(), "dense")
    try:
        texts = drawn_texts(fig)
    finally:
        plt.close(fig)
    overlaps = [(a, b) for i, (a, box) in enumerate(texts) for b, other in texts[i + 1:]
                if box.overlaps(other)]
    assert overlaps == []
    written = "\n".join(text for text, _ in texts)
    for arrow in dense().arrows:
        assert f"{arrow.what} {size_text(arrow.nbytes)}" in written
    for marker in dense().markers:
        assert all(line in written for line in marker.text.split("\n"))
    steps = [text for text, _ in texts if text.startswith("step ") or text.endswith(" starts")]
    assert len(steps) == len(dense().step_starts) == 12
