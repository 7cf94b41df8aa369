"""DASO's per-batch plan, worked by hand for each kind of (B, S, L), held against Heat's.

Records, one per batch (:class:`test_daso_heat.HeatNode` describes them): "n"/"-" the
batch's gradients were/were not averaged in the node; "s1w2" send on rail 1 whose merge
counts a wait of 2 ("c": down-cast); "m0x4" merge of rail 0's sync with weight 4, i.e.
x <- (4x + sum) / (4 + P); "b0" node broadcast from local rank 0; "a1" blocking
average x <- sum / P on rail 1; "r" the rails start again at 0.
"""

import random

import pytest
from test_daso_heat import describe, reachable_states, run_both

from minidp.strategies.daso_schedule import BatchSchedule, DASOSchedule

EXAMPLES = {
    # warm-up and cool-down: every batch a blocking, down-cast sync; rails rotate per send
    "blocking (0, 0, 0)": (2, (0, 0, 0), [
        "n s0w0c a0 b0",
        "n s1w0c a1 b1",
        "n s0w0c a0 b0 r"]),
    # after warm-up: a send every 4 batches, merged one batch later; the send at b4 finds
    # b0's sync merged already and still broadcasts from its rail; the last batch sends
    # (uncast) before it merges the sync in flight, then overwrites that merge
    "(4, 1, 1)": (2, (4, 1, 1), [
        "n s0w1",
        "n m0x2 b0",
        "n",
        "n",
        "n s1w1 b0",
        "n s0w0 m1x2 b1 a0 b0 r"]),
    # the receive due at b1 falls on the batch before a send, which only turns the node
    # sync on: every sync is merged at the next send, after that send has started
    "(2, 1, 1)": (3, (2, 1, 1), [
        "n s0w1",
        "n",
        "n s1w1 m0x2 b0",
        "n",
        "n s2w0 m1x2 b1 a2 b2 r"]),
    # a send every batch, each merging the one before
    "(1, 1, 1)": (2, (1, 1, 1), [
        "n s0w1",
        "n s1w1 m0x2 b0",
        "n s0w1 m1x2 b1",
        "n s1w0 m0x2 b0 a1 b1 r"]),
    # L = 2: node sync off after the receive, then every other batch, on from the batch
    # before a send; the send at b8 waits only 1 (the epoch ends) and broadcasts rail 0's
    # parameters over the node ranks that trained apart
    "(8, 2, 2)": (2, (8, 2, 2), [
        "n s0w2",
        "n",
        "n m0x4 b0",
        "-",
        "n",
        "-",
        "n",
        "-",
        "n s1w1 b0",
        "n s0w0 m1x2 b1 a0 b0 r"]),
    # max_global_skips 2, local_skip_factor 4 reset to S = 0: blocking, uncast syncs
    "(2, 0, 0)": (2, (2, 0, 0), [
        "n s0w0 a0 b0",
        "n",
        "n s1w0 a1 b1",
        "n s0w0 a0 b0 r"]),
    # ... and a plateau there leaves S = -1: each sync merged at the next with weight 1
    "(1, -1, 1)": (2, (1, -1, 1), [
        "n s0w-1",
        "n s1w-1 m0x1 b0",
        "n s0w-1 m1x1 b1 a0 b0 r"]),
    # S > B (max_global_skips 16, local_skip_factor 2, three plateaus): the wait only
    # sets the weight, the merge comes at the next send
    "(2, 5, 1)": (2, (2, 5, 1), [
        "n s0w5",
        "n",
        "n s1w3 m0x10 b0",
        "n",
        "n s0w1 m1x6 b1",
        "n s1w0 m0x2 b0 a1 b1 r"]),
}


@pytest.mark.parametrize("name", EXAMPLES)
def test_hand_worked_epoch(name):
    gpus, values, expected = EXAMPLES[name]
    got, heat = run_both(gpus, [(values, len(expected))])
    assert heat == [expected]  # the worked example reads Heat's code right
    assert got == [expected]


def test_cycling_to_cooldown_keeps_the_node_sync_and_restarts_the_rails():
    got, heat = run_both(3, [((4, 1, 1), 3), ((0, 0, 0), 2)])
    expected = [["n s0w1", "n m0x2 b0", "n s1w0 b0 a1 b1 r"],
                ["n s0w0c a0 b0", "n s1w0c a1 b1 r"]]  # rail 0 again, not 2
    assert heat == expected and got == expected


def test_rails_restart_every_epoch():
    got, heat = run_both(2, [((1, 1, 1), 3)] * 3)
    first_sends = [epoch[0].split()[1] for epoch in got]
    assert first_sends == ["s0w1"] * 3  # three sends an epoch: rotating on would give s1
    assert got == heat


def test_every_epoch_ends_with_the_node_sync_on():
    # Why a checkpoint at an epoch's end holds only the switch: the rails restart and
    # nothing is in flight; and the switch, though it carries over, is always on there.
    rng = random.Random(22)
    states = reachable_states()
    for _ in range(300):
        schedule = BatchSchedule(rng.randint(2, 8))
        schedule.begin_epoch(rng.choice(states), rng.randint(1, 50))
        for b in range(schedule.last + 1):
            schedule.plan(b)
        assert schedule.state_dict() == {"node_sync": True}
        assert (schedule.rail, schedule.previous, schedule.in_flight) == (0, None, None)


def run_from(start, epochs, losses, state=None):
    """Records of epochs start.. of a run with these losses, from a saved state or 0."""
    schedule = DASOSchedule(total_epochs=len(losses), warmup_epochs=1, cooldown_epochs=1,
                            max_global_skips=4, patience=0)
    batches = BatchSchedule(2)
    if state:
        schedule.load_state_dict(state[0])
        batches.load_state_dict(state[1])
    records = []
    for epoch in range(start, epochs):
        batches.begin_epoch(schedule.values, 5 + epoch % 3)
        records.append([describe(batches.plan(b)) for b in range(5 + epoch % 3)])
        schedule.update(epoch + 1, losses[epoch])
        if epoch + 1 == 4:
            state = (schedule.state_dict(), batches.state_dict())
    return records, state


def test_resumed_run_reaches_the_same_plans():
    losses = [1.0, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]
    whole, saved = run_from(0, 8, losses)
    resumed, _ = run_from(4, 8, losses, saved)
    assert resumed == whole[4:]
    # the run went through four different states, so the state carried over mattered
    assert len({tuple(r) for r in whole}) >= 4
