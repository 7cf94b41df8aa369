"""Who sends what to whom, in real 4-rank runs: the trace's arrows and messages.png's data.

Six runs of ``minidp train`` on 4 ranks as 2 nodes x 2 (issue 39): sync with the
hierarchical allreduce, hsgd, daso (one warm-up epoch, then cycling), asgd (workers in
turn) and easgd-rr (rank 0 serves, ranks 1-3 work), easgd-sync. For each, ``trace.json``
must

* pass the check of Chrome's trace format (``tests/chrome_trace.py``), with every flow
  event inside a slice of its rank, so that a viewer draws every arrow;
* hold every arrow exactly once: one start, one end, on two different ranks, both
  members of the collective's group where it is a collective's part;
* account for every message the counters counted: per rank, the point-to-point arrows
  leaving it are the messages and bytes of ``messages_p2p``/``bytes_p2p``, and the
  slices that say what they sent add up to ``bytes_*``/``messages_*`` (its ``sent``
  counters over the whole run).

``minidp report`` draws ``messages.png`` of each; the diagram's data
(:func:`minidp.reporting.sequence.sequence`) is held against what each algorithm sends
in its first steps: who to whom, in which step, how many bytes.
"""

import json
import os
from collections import Counter

import numpy as np
import pytest
from chrome_trace import flow_pairs, problems, unbound_flows
from spmd import run_spmd

from minidp.__main__ import main
from minidp.reporting.sequence import sequence

pytestmark = pytest.mark.xdist_group("trace_arrows")

COMMON = ["-m", "minidp", "train", "--dataset", "synthetic", "--model", "mlp",
          "--test-samples", "64", "--batch-size", "16", "--ranks-per-node", "2",
          "--no-progress", "--train-samples", "320"]
RUNS = {
    "sync": ["--strategy", "sync", "--allreduce", "hierarchical"],
    "hsgd": ["--strategy", "hsgd"],
    # 2 steps per epoch: epoch 1 blocks (steps 1-2), epoch 2 cycles with (4, 1, 1).
    "daso": ["--strategy", "daso", "--epochs", "3", "--set", "daso.warmup_epochs=1",
             "--set", "daso.cooldown_epochs=1", "--train-samples", "128"],
    # Workers in turn: each takes every third batch of the epoch's budget, so each one's
    # first 3 steps are before the epoch's end (first come first served lets a worker
    # descheduled on a busy machine do fewer, its step 3 then holding the epoch's end).
    "asgd": ["--strategy", "asgd", "--set", "asgd.order=round_robin"],
    "easgd-rr": ["--strategy", "easgd-rr"],
    "easgd-sync": ["--strategy", "easgd-sync"],
}
SERVED = ("asgd", "easgd-rr")
HANG_S = 900  # a hang guard for one job on a loaded machine, never a bound a test asserts


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run's directory (trained once for the module)."""
    base = tmp_path_factory.mktemp("arrows")
    data = str(base / "data")
    done = {}
    for name, flags in RUNS.items():
        out = str(base / name)
        launch = run_spmd([*COMMON, "--data-dir", data, *flags, "--out", out], 4,
                          timeout=HANG_S)
        assert launch.returncode == 0, f"{name}:\n{launch.output[-3000:]}"
        done[name] = out
    return done


def events_of(out):
    with open(os.path.join(out, "trace.json")) as f:
        trace = json.load(f)
    assert problems(trace) == []
    return trace["traceEvents"]


def groups(name):
    """The world ranks of each group a collective's arrow names, for the run's layout."""
    if name in SERVED:  # rank 0 serves on node 0; workers 1 | 2, 3
        return {"world": {0, 1, 2, 3}, "node 0": {1}, "node 1": {2, 3}, "rail 0": {1, 2},
                "rail 1": {3}}
    return {"world": {0, 1, 2, 3}, "node 0": {0, 1}, "node 1": {2, 3}, "rail 0": {0, 2},
            "rail 1": {1, 3}}


@pytest.mark.parametrize("name", list(RUNS))
def test_every_message_is_one_arrow_from_its_sender_to_its_receiver(runs, name):
    events = events_of(runs[name])
    assert unbound_flows(events) == []
    pairs, odd = flow_pairs(events)
    assert odd == [] and pairs
    members = groups(name)
    for start, end in pairs.values():
        assert start["pid"] != end["pid"] and start["cat"] == end["cat"]
        if start["cat"] == "collective":
            assert {start["pid"], end["pid"]} <= members[start["args"]["group"]]
    sent = {e["pid"]: e["args"] for e in events if e["ph"] == "C" and e["name"] == "sent"}
    assert sorted(sent) == [0, 1, 2, 3]
    for rank, counters in sent.items():
        mine = [s for s, _ in pairs.values() if s["pid"] == rank and s["cat"] == "p2p"]
        assert len(mine) == counters.get("messages_p2p", 0)
        assert sum(s["args"]["bytes"] for s in mine) == counters.get("bytes_p2p", 0)
        said = [e["args"] for e in events if e["ph"] == "X" and e["pid"] == rank
                and "bytes" in e.get("args", {})]
        for kind in ("bytes", "messages"):
            assert sum(int(a[kind]) for a in said) == sum(
                counters.get(f"{kind}_{level}", 0) for level in ("intra", "inter", "mpi"))
    if name in SERVED or name == "easgd-sync":  # their algorithms are messages
        assert sum(c.get("messages_p2p", 0) for c in sent.values()) > 0


def parameter_bytes(out):
    with np.load(os.path.join(out, "model.npz")) as model:
        return sum(model[k].size for k in model.files) * 4  # float32


def arrows_by_step(out, steps):
    d = sequence(events_of(out), steps)
    by_step = {}
    for a in d.arrows:
        by_step.setdefault(a.step, []).append(a)
    return d, by_step


@pytest.mark.parametrize("name", ["sync", "hsgd"])
def test_a_hierarchical_step_sums_in_the_node_across_the_rails_and_back(runs, name):
    _, by_step = arrows_by_step(runs[name], 3)
    half = parameter_bytes(runs[name]) // 2  # rail k carries slice k: half of it
    for step in (1, 2, 3):
        got = Counter((a.source, a.dest, a.what, a.level) for a in by_step[step])
        assert got == Counter({(1, 0, "node sum", "intra"): 1, (3, 2, "node sum", "intra"): 1,
                               (2, 0, "rail sum", "inter"): 1, (3, 1, "rail sum", "inter"): 1,
                               (0, 1, "node result", "intra"): 1,
                               (2, 3, "node result", "intra"): 1}), step
        rails = [a for a in by_step[step] if a.what == "rail sum"]
        # a ring over 2 nodes counts 2(P-1)/P of the slice: the slice itself
        assert all(abs(a.nbytes - half) <= 4 for a in rails)


def test_daso_rails_join_local_rank_k_of_each_node_and_a_sync_overlaps_a_batch(runs):
    d, by_step = arrows_by_step(runs["daso"], 4)
    rails = [a for a in d.arrows if a.what.startswith("rail sum")]
    assert rails and all(a.level == "inter" and a.source % 2 == a.dest % 2 and
                         a.source // 2 != a.dest // 2 for a in rails)
    assert all(a.level == "intra" and a.source // 2 == a.dest // 2
               for a in d.arrows if a.what.startswith(("node", "replica")))
    # epoch 2 (steps 3, 4) cycles: step 3's send is merged in step 4, a batch later
    starts = {(r, s): t for r, s, t in d.step_starts}
    in_flight = [a for a in by_step[3] if a.what == "rail sum"
                 and a.arrived > starts[(a.dest, 4)]]
    assert in_flight
    said = {m.step: m.text for m in d.markers if m.text.startswith("send")}
    assert "B,S,L=0,0,0" in said[1] and "B,S,L=4,1,1" in said[3]


def test_asgd_each_worker_pulls_computes_and_pushes_every_step(runs):
    out = runs["asgd"]
    p = parameter_bytes(out)
    d, by_step = arrows_by_step(out, 3)
    for step in (1, 2, 3):
        for w in (1, 2, 3):
            got = sorted((a.source, a.dest, a.what, a.nbytes) for a in by_step[step]
                         if w in (a.source, a.dest))
            assert got == sorted([(w, 0, "pull", 32), (0, w, "pull reply", 32),
                                  (0, w, "parameters", p), (w, 0, "push", 32),
                                  (w, 0, "push gradient", p)]), (step, w)
    # One line per decision: decisions taken together are one marker, a line each.
    updates = [line for m in d.markers if m.rank == 0 for line in m.text.split("\n")]
    assert len(updates) == 9 and all("stale" in u and "lr " in u for u in updates), updates


def test_easgd_rr_exchanges_go_master_to_workers_in_rank_order(runs):
    out = runs["easgd-rr"]
    p = parameter_bytes(out)
    d, _ = arrows_by_step(out, 3)
    centre = [a for a in d.arrows if a.what == "centre"]
    assert [a.dest for a in centre] == [1, 2, 3] * 3
    assert all(a.source == 0 and a.nbytes == p for a in centre)
    # the k-th centre a worker gets is its step k's; its parameters went first
    for w in (1, 2, 3):
        assert [a.step for a in centre if a.dest == w] == [1, 2, 3]
        mine = [a for a in d.arrows if w in (a.source, a.dest) and a.kind == "p2p"]
        assert [(a.what, a.source) for a in mine] == [("parameters", w), ("centre", 0)] * 3
    decisions = Counter(m.rank for m in d.markers for _ in m.text.split("\n"))
    assert decisions == {0: 9, 1: 3, 2: 3, 3: 3}, d.markers


def test_easgd_sync_sums_up_a_tree_and_sends_the_centre_down_one(runs):
    d, by_step = arrows_by_step(runs["easgd-sync"], 3)
    for step in (1, 2, 3):
        assert sorted((a.source, a.dest) for a in by_step[step] if a.what == "partial sum") \
            == [(1, 0), (2, 0), (3, 2)]
    # rank 0 sends the new centre to 2 and 1 after a step's exchange; rank 2 passes its
    # copy on to 3 when it takes it, in its next step (step 3's centre arrives in step 4,
    # past the diagram)
    expected = {1: [(0, 1), (0, 2)], 2: [(0, 1), (0, 2), (2, 3)], 3: [(2, 3)]}
    for step, links in expected.items():
        assert sorted((a.source, a.dest) for a in by_step[step] if a.what == "centre") \
            == links, step


@pytest.mark.parametrize("name", list(RUNS))
def test_report_draws_messages_png(runs, name, tmp_path):
    out = tmp_path / "report"
    assert main(["report", runs[name], "--out", str(out), "--steps", "3"]) == 0
    with open(out / "messages.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert "![" in (out / "report.md").read_text()
