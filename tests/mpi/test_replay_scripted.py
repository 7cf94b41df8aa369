"""SPMD at 4 ranks: asynchronous runs whose staleness the test chooses, replayed bit for bit.

The server (or the elastic master) takes the workers' messages in the order a script
says (``--set NAME.order=...``, :mod:`minidp.strategies.serving`), so the staleness of
every gradient is fixed by the script, on a loaded machine as on a quiet one. Each case
states the staleness values its run must meet, {value: how many}, worked out below from
the script (and rank 0 prints them); the replay must meet exactly those and equal the
run's ``model.npz`` bit for bit. Together the cases put sigma = 0, 1 and 2 under every
rule, and softsync's ``mean`` rule meets buffers whose mean staleness is 4/3, above 1,
where dividing the rate by it matters.

How a script gives the staleness (one server, workers 1, 2, 3; the epoch's budget is 30
batches; a worker's messages alternate pull, push; staleness = updates between a
gradient's pull and its push; the script restarts every epoch):

* ``1,2,3``: each round every worker pulls at version v, then they push in turn and the
  j-th push meets j updates: sigma 0, 1, 2 each round, 10 rounds an epoch.
* ``1x3,2,1,3``, twice through is a period of 6 gradients: (w1 pull, push 0, pull; w2
  pull; w1 push 0; w3 pull) then (w1 pull, push 0, pull; w2 push 2; w1 push 1; w3
  push 3): sigma 0, 0, 0, 2, 1, 3; 5 periods an epoch.
* ``3,2,1x6,2,3``: workers 3 and 2 pull, worker 1 pulls and pushes three times (3
  updates), then worker 2 pushes (sigma 3) and worker 3 (sigma 4); 6 turns an epoch.
* ``2,3,1x12,2,3,1x2`` with softsync c = 3: workers 2 and 3 pull at version v; worker 1
  pulls and pushes six times (updates v+1, v+2 of three fresh gradients each); workers
  2 and 3 push (sigma 2 each), worker 1 pulls and pushes (sigma 0): that buffer's mean
  is 4/3. Three turns take 27 of the 30 batches; in the fourth, worker 1 pushes once
  more and leaves, workers 2 and 3 push fresh gradients: a buffer of mean 0.

The elastic master: an exchange's staleness is how many times the other workers moved
the centre since this worker's last exchange (for its first, since the start).
"""

from fractions import Fraction

import pytest
import replay_runs
from mpi4py import MPI
from replay_runs import EPOCH_END, GRADIENT, occurred, replayed, server_rows, train, worker_rows

world = MPI.COMM_WORLD
pytestmark = pytest.mark.skipif(world.size != 4, reason="4 ranks: 1 server and 3 workers")
ROUND = "1,2,3"
PERIOD_OF_6 = "1x3,2,1,3"
FAR_BEHIND = "3,2,1x6,2,3"
BUFFER_MEAN_4_3 = "2,3,1x12,2,3,1x2"
EVERY_ROUND = {0: 20, 1: 20, 2: 20}  # ROUND: 10 rounds an epoch, 2 epochs


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return replay_runs.write_data(tmp_path_factory)


CASES = [
    pytest.param("asgd", {"order": ROUND},
                 dict(weight_decay=1e-3, schedule="cosine", momentum=0.5), EVERY_ROUND,
                 id="asgd"),
    pytest.param("amsgd", {"order": PERIOD_OF_6},
                 dict(momentum=0.5, nesterov=True, weight_decay=1e-3),
                 {0: 30, 1: 10, 2: 10, 3: 10}, id="amsgd-nesterov"),
    # Gupta et al.'s lr / max(<sigma>, 1), c = 1: sigma 2 halves the rate
    pytest.param("softsync", {"n": 3, "order": ROUND}, dict(schedule="step"), EVERY_ROUND,
                 id="softsync-n3-mean"),
    # c = 3: buffers of mean 0 and of mean 4/3 (two gradients of sigma 2, one of 0)
    pytest.param("softsync", {"n": 1, "order": BUFFER_MEAN_4_3}, {}, {0: 48, 2: 12},
                 id="softsync-n1-mean"),
    # Zhang et al.'s g / max(sigma, 1): the two gradients of sigma 2 halved in the buffer
    pytest.param("softsync", {"n": 1, "rule": "each", "order": BUFFER_MEAN_4_3}, {},
                 {0: 48, 2: 12}, id="softsync-n1-each"),
    pytest.param("softsync", {"n": 3, "rule": "each", "server_momentum": True,
                              "order": ROUND}, dict(momentum=0.5), EVERY_ROUND,
                 id="softsync-n3-each-momentum"),
    # n = 2 does not divide 3 workers: c = 1, every gradient an update
    pytest.param("softsync", {"n": 2, "order": FAR_BEHIND}, dict(weight_decay=1e-3),
                 {0: 36, 3: 12, 4: 12}, id="softsync-n2"),
    # b_i / b: the straggler's batches shrink. The sizes follow measured speeds, but each
    # round's three come from one allocation (made at the previous round's last push),
    # which sums to 3 x 8: the budget of 240 samples still lasts exactly 10 rounds
    pytest.param("dbs", {"order": ROUND}, dict(weight_decay=1e-3, slowdown="3:20"),
                 EVERY_ROUND, id="dbs"),
    pytest.param("amsgd", {"order": FAR_BEHIND}, dict(momentum=0.5, dtype="float32"),
                 {0: 36, 3: 12, 4: 12}, id="amsgd-float32"),
    # easgd-rr's master takes the workers in rank order (it has no order option): the
    # first exchanges meet 0, 1, 2 moves of the centre, every later one 2 (tau 1: 10
    # exchanges a worker an epoch)
    pytest.param("easgd-rr", {}, dict(weight_decay=1e-3), {0: 1, 1: 1, 2: 58},
                 id="easgd-rr"),
    # the same in turn with tau = 2: 5 exchanges a worker an epoch
    pytest.param("easgd-async", {"tau": 2, "order": ROUND}, dict(schedule="cosine"),
                 {0: 1, 1: 1, 2: 28}, id="easgd-async-tau2"),
    # 1,3,2,2,3,1: firsts 0 (w1), 1 (w3), 2 (w2); then w2 again 0, w3 2 (w2 twice), w1 4;
    # every later turn: w1 0 (right after itself), w3 2, w2 4, w2 0, w3 2, w1 4
    pytest.param("measgd-async", {"order": "1,3,2,2,3,1"},
                 dict(weight_decay=1e-3, schedule="step"), {0: 20, 1: 1, 2: 20, 4: 19},
                 id="measgd-async"),
]


def buffer_means(out, c):
    """softsync: each update's mean staleness, as the server's record groups them.

    Every c gradients make an update; at an epoch's end what the buffer holds is one more.
    Written apart from the strategy and the replay: from events.json's server rows.
    """
    means, buffered = [], []
    for kind, _, staleness, _ in server_rows(out):
        if kind == GRADIENT:
            buffered.append(staleness)
        if buffered and (len(buffered) == c or kind == EPOCH_END):
            means.append(Fraction(sum(buffered), len(buffered)))
            buffered = []
    return {m: means.count(m) for m in sorted(set(means))}


@pytest.mark.parametrize("strategy,options,settings,expected", CASES)
def test_a_scripted_run_meets_the_staleness_it_was_given_and_replays(
        data_dir, tmp_path, capsys, strategy, options, settings, expected):
    out = train(data_dir, tmp_path, strategy, options, **settings)
    outcome = replayed(out)
    stated = f"staleness that occurred {{value: count}}: {occurred(outcome)}"
    with capsys.disabled():
        if world.rank == 0:
            print(f"\n{strategy} {options} {settings}: {stated}")
    assert outcome.status == 0, "\n".join(outcome.lines + [stated])
    assert outcome.lines[-1].startswith("result: equal to model.npz bit for bit"), stated
    assert occurred(outcome) == expected, stated
    if options.get("order") == BUFFER_MEAN_4_3:  # 3 turns an epoch of means 0, 0, 4/3; then 0
        assert buffer_means(out, 3) == {0: 14, Fraction(4, 3): 6}, buffer_means(out, 3)
    if strategy == "dbs":  # the straggler took other sizes than b: the weights b_i / b differ
        assert {row[1] for row in worker_rows(out)[3]} != {8}, worker_rows(out)[3]
