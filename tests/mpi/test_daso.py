"""SPMD: DASO carried out: the merge formula, the trace against Heat's decisions, agreement.

The decisions themselves are checked without MPI against a transcription of Heat's code
(tests/unit/test_daso_heat.py); here the real strategy's trace must show the same, in
the same order, and the parameters must agree where DASO says they do.
"""

import math

import numpy as np
import pytest
from strategy_runs import PER_RANK, build, global_batch, layouts, run, topology, world
from unit.test_daso_heat import HeatNode

from minidp import Tensor
from minidp import functional as F
from minidp.trace import Tracer, set_tracer

two_by_two = pytest.mark.skipif(world.size != 4, reason="needs 4 ranks: 2 nodes of 2")
# (B, S, L) and batches per epoch: each kind of state, L = 2, S > B, and a cool-down
EPOCHS = [((4, 1, 1), 9), ((2, 1, 1), 7), ((1, 1, 1), 5), ((8, 2, 2), 11), ((2, 5, 1), 6),
          ((0, 0, 0), 4)]


def set_values(s, values):
    s.schedule.load_state_dict({"values": list(values), "best": math.inf, "bad_epochs": 0})


def train_epoch(s, epoch, batches, after=None):
    t = s.topology
    s.begin_epoch(epoch, batches)
    for b in range(batches):
        x, y = global_batch(epoch, b, t.size)
        mine = slice(t.rank * PER_RANK, (t.rank + 1) * PER_RANK)
        s.optimizer.zero_grad()
        F.cross_entropy(s.model(Tensor(x[mine])), y[mine]).backward()
        s.step(b)
        if after:
            after(b)


def records(events, epoch, batches):
    """The trace's DASO events of ``epoch`` in HeatNode's format, one string per batch."""
    words = [["-"] for _ in range(batches)]
    for e in events:
        if e["ph"] != "i" or not e["name"].startswith("daso ") or e["args"]["epoch"] != epoch:
            continue
        a, action = e["args"], e["name"][len("daso "):]
        batch = words[a["batch"]]
        if action == "node sync":
            batch[0] = "n"
        elif action == "send":
            batch.append(f"s{a['rail']}w{a['wait']}" + ("c" if a["cast"] else ""))
        elif action == "merge":
            batch.append(f"m{a['rail']}x{a['weight']:g}")
        else:
            batch.append({"broadcast": f"b{a.get('root')}", "average": f"a{a.get('rail')}",
                          "rails reset": "r"}[action])
    return [" ".join(w) for w in words]


def equal_over(comm, x):
    gathered = comm.allgather(x.copy())
    return all(np.array_equal(g, gathered[0]) for g in gathered)


@two_by_two
@pytest.mark.parametrize("sync", ["all", "rail"])
@pytest.mark.parametrize("values, steps, weight", [
    ((8, 2, 2), 3, 4.0),  # send at batch 0, merge at batch 2 with weight 2 * 2
    ((1, -1, 1), 2, 1.0),  # a plateau left S = -1: merged at the next batch, weight 1
])
def test_merge_formula_on_known_node_values(sync, values, steps, weight):
    t = topology(2)
    s = build("daso", t, global_sync=sync)
    s.node_identical = False  # the test makes the node's ranks differ by hand
    set_values(s, values)
    s.begin_epoch(0, 10)
    xs = [t.node_id + 1.0, 10.0 * (t.node_id + 1) + t.local_rank, None][:steps]
    for b, x in enumerate(xs):
        s.flat.grad[...] = 0.0  # plain SGD: the update leaves x as set
        if x is not None:
            s.flat.data[...] = x  # sent at batch 0: node p sends p + 1; then drifted on
        s.step(b)
    sent_sum = sum(p + 1.0 for p in range(t.num_nodes))
    x_local_of_rail0 = 10.0 * (t.node_id + 1)  # rail 0 = local rank 0 merges, broadcasts
    expected = (weight * x_local_of_rail0 + sent_sum) / (weight + t.num_nodes)
    np.testing.assert_allclose(s.flat.data, expected, rtol=0, atol=1e-12)


@two_by_two
@pytest.mark.parametrize("sync", ["all", "rail"])
def test_trace_shows_heats_decisions_and_the_ranks_agree_where_they_should(sync):
    tracer = set_tracer(Tracer(world.rank))
    t = topology(2)
    s = build("daso", t, downcast="bf16", global_sync=sync)
    tracer.reset()  # count the epochs' inter-node messages, not the start-up broadcast
    heat, node_checks = HeatNode(t.local_size), []
    for epoch, (values, batches) in enumerate(EPOCHS):
        set_values(s, values)
        heat.begin_epoch(values, batches)
        expected = [heat.step() for _ in range(batches)]

        def after(b, expected=expected):
            if " b" in expected[b]:  # after a node broadcast the node agrees
                node_checks.append(equal_over(t.node, s.flat.data))

        train_epoch(s, epoch, batches, after)
        assert records(tracer.events, epoch, batches) == expected, f"epoch {epoch}"
        assert equal_over(world, s.flat.data)  # the last batch's blocking sync
    assert len(node_checks) > 20 and all(node_checks)
    sends_mine = sum(1 for e in tracer.events if e["name"] == "daso send"
                     and (sync == "all" or e["args"]["rail"] == t.local_rank))
    # rail: only the rail of each sync crosses nodes; all: every rail, with its slice;
    # either way a ring over P nodes, 2 (P - 1) messages
    assert tracer.counters["messages_inter"] == sends_mine * 2 * (t.num_nodes - 1) > 0


def run_epochs(sync, downcast="none", epochs=EPOCHS):
    """EPOCHS with momentum; this rank's parameters and the inter-node bytes of its node."""
    tracer = set_tracer(Tracer(world.rank))
    t = topology(2)
    s = build("daso", t, optimizer={"momentum": 0.9}, downcast=downcast, global_sync=sync)
    tracer.reset()
    for epoch, (values, batches) in enumerate(epochs):
        set_values(s, values)
        train_epoch(s, epoch, batches)
    node_bytes = t.node.allreduce(tracer.counters["bytes_inter"])
    return s.flat.data.copy(), node_bytes, s


@two_by_two
@pytest.mark.parametrize("downcast", ["none", "bf16"])
def test_all_rails_compute_exactly_what_one_rail_does(downcast):
    # blocking epochs on an identical node, then cycling with L = 2 (the node's momenta
    # part), then blocking epochs on a node that is no longer identical
    epochs = [((0, 0, 0), 3)] + EPOCHS
    by_rails, bytes_all, s = run_epochs("all", downcast, epochs)
    assert not s.node_identical
    by_rail, bytes_rail, _ = run_epochs("rail", downcast, epochs)
    np.testing.assert_array_equal(by_rails, by_rail)
    assert bytes_all == bytes_rail > 0  # the same volume leaves the node, split over rails


@two_by_two
@pytest.mark.parametrize("sync", ["all", "rail"])
def test_bf16_words_carry_two_bytes_per_parameter(sync):
    blocking = [((0, 0, 0), 4), ((0, 0, 0), 3)]
    x_full, bytes_full, s = run_epochs(sync, "none", blocking)
    x16, bytes16, _ = run_epochs(sync, "bf16", blocking)
    assert bytes16 * s.flat.data.itemsize // 2 == bytes_full > 0  # 2 bytes a word, not 8
    assert 0 < np.abs(x16 - x_full).max() < 0.05  # rounded, not broken


@two_by_two
@pytest.mark.parametrize("values", [(0, 0, 0), (2, 1, 1)])
def test_an_identical_node_keeps_one_replica_and_each_rank_steps_its_slice(values):
    # all rails, node synced every batch: the node's ranks share one x in a node window;
    # per batch one slice mean per rank and one closing sync, no whole-buffer node
    # reduction or broadcast; a blocking send's slice goes out at once
    tracer = set_tracer(Tracer(world.rank))
    t = topology(2)
    s = build("daso", t, optimizer={"momentum": 0.9})
    tracer.reset()
    set_values(s, values)
    train_epoch(s, 0, 4)
    ops = [(e["name"], e["args"].get("op")) for e in tracer.events if e["ph"] == "X"]
    assert ops.count(("comm_intra", "node_reduce")) == 4
    assert ops.count(("comm_intra", "replica_sync")) == 4
    assert not [op for name, op in ops if op in ("node_allreduce", "node_broadcast")]
    # (0, 0, 0): four blocking sends; (2, 1, 1): two started ones, waited at their merges,
    # and the epoch's last batch's blocking one
    started, blocking = (0, 4) if values == (0, 0, 0) else (2, 1)
    assert ops.count(("wait", "rail iallreduce")) == started
    assert ops.count(("comm_inter", "rail_allreduce")) == blocking
    assert s.replica.shared and equal_over(world, s.flat.data)
    if t.local_rank == 0:
        s.flat.data[0] = 12345.0
    s.replica.windows[0].sync()
    assert s.flat.data[0] == 12345.0  # one replica: local rank 0's write is every rank's


def train_run(s, losses, start=0, stop=None):
    """Epochs start..stop with the real schedule, fed ``losses``."""
    for epoch in range(start, len(losses) if stop is None else stop):
        train_epoch(s, epoch, 5 + epoch % 3)
        s.end_epoch(epoch, losses[epoch])


@two_by_two
def test_resumed_run_reaches_the_same_events_and_parameters():
    options = dict(optimizer={"momentum": 0.9}, warmup_epochs=1, cooldown_epochs=1,
                   max_global_skips=4, patience=0)
    losses = [1.0, 0.9, 0.9, 0.9, 0.9, 0.9]  # (0,0,0) (4,1,1) (4,1,1) (2,1,1) (1,1,1) (0,0,0)
    t = topology(2)
    whole = build("daso", t, **options)
    whole.plan(len(losses))
    tracer = set_tracer(Tracer(world.rank))
    train_run(whole, losses)
    uninterrupted = [records(tracer.events, e, 5 + e % 3) for e in range(3, len(losses))]
    first = build("daso", t, **options)
    first.plan(len(losses))
    train_run(first, losses, stop=3)
    saved = (first.state_dict(), first.optimizer.state_dict(), first.flat.data.copy())
    resumed = build("daso", t, **options)
    resumed.plan(len(losses))
    resumed.load_state_dict(saved[0])
    resumed.optimizer.load_state_dict(saved[1])
    resumed.flat.data[...] = saved[2]
    tracer = set_tracer(Tracer(world.rank))
    train_run(resumed, losses, start=3)
    assert [records(tracer.events, e, 5 + e % 3) for e in range(3, len(losses))] == \
        uninterrupted
    assert len(set(map(tuple, uninterrupted))) == 3  # three different states resumed into
    np.testing.assert_array_equal(resumed.flat.data, whole.flat.data)


def test_every_layout_ends_each_epoch_with_one_model():
    # one rank per node (rails of one rank, P = world size) and, at 4 ranks, 2 x 2;
    # one node (world size 1): synchronous SGD
    for ranks_per_node in layouts():
        s = build("daso", topology(ranks_per_node))
        for epoch, (values, batches) in enumerate(EPOCHS[:4]):
            set_values(s, values)
            train_epoch(s, epoch, batches)
            assert equal_over(world, s.flat.data)


@two_by_two
def test_cycling_differs_from_flat_sync_but_stays_close():
    got, _ = run("daso", 2, warmup_epochs=1, cooldown_epochs=0, epochs=3, batches=9)
    expected, _ = run("sync", 2, allreduce="mpi", epochs=3, batches=9)
    gap = np.abs(got - expected).max()
    assert 1e-9 < gap < 0.5
