"""SPMD: DASO's internals: merge formula, rail rotation, node and world agreement, timing."""

import math

import numpy as np
from strategy_runs import build, run, topology, world


def schedule(s, b, s_, l_):
    s.schedule.load_state_dict({"values": [b, s_, l_], "best": math.inf, "bad_epochs": 0})


def two_level_layout():
    return 2 if world.size == 4 else None


def test_merge_formula_on_known_node_values():
    rpn = two_level_layout()
    if rpn is None:
        return
    t = topology(rpn)
    s = build("daso", t)
    s.begin_epoch(0, 10)
    s.flat.data[...] = t.node_id + 1.0                  # node p sends x_p = p + 1
    s.send(batch=0, wait=2)
    s.flat.data[...] = 10.0 * (t.node_id + 1) + t.local_rank  # drifted on since
    s.receive(batch=2)
    wait, nodes = 2, t.num_nodes
    sent_sum = sum(p + 1.0 for p in range(nodes))
    x_local_of_rail0 = 10.0 * (t.node_id + 1)           # rail 0 = local rank 0 merges
    expected = (2 * wait * x_local_of_rail0 + sent_sum) / (2 * wait + nodes)
    np.testing.assert_allclose(s.flat.data, expected, rtol=0, atol=1e-12)


def test_rails_rotate_and_only_that_rail_communicates_across_nodes():
    rpn = two_level_layout()
    if rpn is None:
        return
    from minidp.trace import Tracer, set_tracer

    tracer = set_tracer(Tracer(world.rank))
    t = topology(rpn)
    s = build("daso", t, warmup_epochs=0, cooldown_epochs=0)
    tracer.reset()  # count this epoch's rails only, not the start-up broadcast
    s.plan(1)
    schedule(s, 2, 1, 1)
    s.begin_epoch(0, 9)
    run_epoch(s, 0, 9)
    rails = [rail for _, rail in s.sent_on]
    assert rails == [k % t.local_size for k in range(len(rails))]
    assert [b for b, _ in s.sent_on] == [0, 2, 4, 6, 8]
    assert s.received_on == [1, 3, 5, 7]
    mine = sum(1 for r in rails if r == t.local_rank)
    assert tracer.counters["messages_inter"] == mine * 2 * (t.num_nodes - 1)


def run_epoch(s, epoch, batches, after=None):
    from strategy_runs import PER_RANK, global_batch

    from minidp import Tensor
    from minidp import functional as F
    t = s.topology
    for b in range(batches):
        x, y = global_batch(epoch, b, t.size)
        mine = slice(t.rank * PER_RANK, (t.rank + 1) * PER_RANK)
        s.optimizer.zero_grad()
        F.cross_entropy(s.model(Tensor(x[mine])), y[mine]).backward()
        s.step(b)
        if after:
            after(s, b)


def test_nodes_agree_after_every_receive_and_the_world_at_every_epoch_end():
    rpn = two_level_layout() or 1
    t = topology(rpn)
    s = build("daso", t, warmup_epochs=0, cooldown_epochs=0)
    s.plan(3)
    agree = []

    def after(s, b):
        if b in s.received_on:
            node = s.topology.node.allgather(s.flat.data.copy())
            agree.append(all(np.array_equal(n, node[0]) for n in node))

    for epoch, values in enumerate([(4, 1, 1), (2, 1, 1), (8, 2, 2)]):
        schedule(s, *values)
        s.begin_epoch(epoch, 11)
        run_epoch(s, epoch, 11, after)
        everyone = world.allgather(s.flat.data.copy())
        assert all(np.array_equal(e, everyone[0]) for e in everyone)
        if t.num_nodes > 1:
            assert s.sent_on[-1][0] == 10  # the last batch is always a (blocking) send
    assert agree and all(agree) if t.num_nodes > 1 else not agree


def test_cycling_differs_from_sync_but_stays_close():
    rpn = two_level_layout()
    if rpn is None:
        return
    got, _ = run("daso", rpn, warmup_epochs=1, cooldown_epochs=0, epochs=3, batches=9)
    expected, _ = run("sync", rpn, epochs=3, batches=9)
    gap = np.abs(got - expected).max()
    assert 1e-9 < gap < 0.5
