"""SPMD at 4 ranks: every asynchronous strategy trained first come first served, then replayed.

Each run goes through the Trainer, first come first served, rank 3 a straggler (its
compute 20x slower), float64 unless said (``replay_runs``); rank 0 then replays it in
one process (``minidp.replay``: the update rules written from the papers, apart from
``minidp.strategies``) and the replay must equal the run's ``model.npz`` bit for bit.
These runs take the order the scheduler gave them, which the run recorded: they test
that a real order replays. Each case prints the staleness values that occurred (how
many gradients met each); they follow the scheduler, so none is asserted here. The
staleness each rule needs (sigma = 0, 1, 2, a buffer whose mean exceeds 1) is chosen by
a scripted order in ``test_replay_scripted.py``, the same on every run. docs/replay.md
lists what each case covers. A parameter server resumed between epochs under a
decaying schedule must equal the uninterrupted run bit for bit (its rate's clock is
restored).
"""

import json
import os
import re
import shutil

import numpy as np
import pytest
import replay_runs
from mpi4py import MPI
from replay_runs import occurred, replayed, worker_rows

from minidp.__main__ import main
from minidp.replay import replay
from minidp.reporting.runs import rank_phases
from minidp.run.config import TrainConfig
from minidp.run.trainer import Trainer

world = MPI.COMM_WORLD
pytestmark = pytest.mark.skipif(world.size != 4, reason="4 ranks: 1 server and 3 workers")
STRAGGLER = "3:20"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return replay_runs.write_data(tmp_path_factory)


def train(data_dir, tmp_path, strategy, options=None, **settings):
    """A run with rank 3 the straggler unless ``slowdown`` says otherwise."""
    return replay_runs.train(data_dir, tmp_path, strategy, options,
                             **dict(dict(slowdown=STRAGGLER), **settings))


CASES = [
    ("asgd", {}, dict(weight_decay=1e-3, schedule="cosine", momentum=0.5)),  # ignored
    ("asgd", {"servers": 2}, dict(warmup_epochs=1)),
    ("amsgd", {}, dict(momentum=0.5, nesterov=True, weight_decay=1e-3)),
    ("softsync", {"n": 1}, {}),  # Gupta et al.'s lr / <sigma>, c = 3
    ("softsync", {"n": 3}, dict(schedule="step")),  # lr / <sigma>, c = 1
    ("softsync", {"n": 1, "rule": "each"}, {}),  # Zhang et al.'s g / sigma, c = 3
    ("softsync", {"n": 3, "rule": "each", "server_momentum": True}, dict(momentum=0.5)),
    ("softsync", {"n": 2}, dict(weight_decay=1e-3)),  # n does not divide 3: c = 1, not 2
    ("dbs", {}, dict(weight_decay=1e-3)),  # b_i / b, sizes follow the speeds
    ("easgd-async", {"tau": 2}, dict(schedule="cosine")),
    ("measgd-async", {}, dict(weight_decay=1e-3, schedule="step")),
    ("amsgd", {}, dict(momentum=0.5, dtype="float32")),
]


@pytest.mark.parametrize("strategy,options,settings", CASES,
                         ids=[f"{s}-{'-'.join(f'{k}={v}' for k, v in {**o, **t}.items())}"
                              for s, o, t in CASES])
def test_a_run_replays_bit_for_bit_from_the_papers_rules(data_dir, tmp_path, capsys,
                                                         strategy, options, settings):
    out = train(data_dir, tmp_path, strategy, options, **settings)
    printed = capsys.readouterr().out
    outcome = replayed(out)
    stated = f"staleness that occurred {{value: count}}: {occurred(outcome)}"
    with capsys.disabled():
        if world.rank == 0:
            print(f"\n{strategy} {options} {settings}: {stated}")
    assert outcome.status == 0, "\n".join(outcome.lines + [stated])
    assert outcome.lines[-1].startswith("result: equal to model.npz bit for bit"), stated
    if strategy == "dbs":  # the straggler took fewer samples: b_i / b weights differ
        rows = worker_rows(out)
        assert {row[1] for row in rows[3]} != {8}, rows[3]
        assert min(row[1] for row in rows[3][-5:]) < min(row[1] for row in rows[1][-5:])
    if world.rank == 0 and strategy == "asgd" and not options:
        assert "note: --strategy asgd ignores --momentum 0.5" in printed


def test_dbs_rounds_replay_with_unequal_sizes_and_no_staleness(data_dir, tmp_path):
    out = train(data_dir, tmp_path, "dbs", {"update": "round"}, momentum=0.5)
    outcome = replayed(out)
    stated = f"staleness that occurred {{value: count}}: {occurred(outcome)}"
    assert outcome.status == 0, "\n".join(outcome.lines + [stated])
    assert set(outcome.staleness) == {0}, stated  # the round's rule: every gradient fresh
    rows = worker_rows(out)
    assert len({row[1] for w in rows for row in rows[w]}) > 1  # b_i / sum b, unequal
    assert all(u.rule.startswith("sum b_i g_i") for u in outcome.updates)


def test_dbs_bounds_that_cannot_hold_the_total_are_refused_before_training(data_dir,
                                                                          tmp_path):
    config = TrainConfig(strategy="dbs", options={"min_batch": 9}, dataset="synthetic",
                         model="mlp", batch_size=8, train_samples=240, data_dir=data_dir,
                         out=world.bcast(str(tmp_path / "refused")), progress=False)
    with pytest.raises(ValueError, match=rf"rank {world.rank}: dbs.min_batch/max_batch: got "
                                         r"\[9, 32\], allowed: a range holding --batch-size "
                                         r"8 \(the 3 sizes must sum to 3 x 8\)"):
        Trainer(config)


def test_what_differs_or_cannot_be_replayed_is_said(data_dir, tmp_path, capsys):
    out = train(data_dir, tmp_path, "asgd")
    server = rank_phases(os.path.join(out, "trace.json")) if world.rank == 0 else None
    if world.rank:
        world.Barrier()
        return
    # the server's waiting for work is its own phase, not communication
    with open(os.path.join(out, "trace.json")) as f:
        events = json.load(f)["traceEvents"]
    assert any(e["name"] == "idle" and e["pid"] == 0 for e in events)
    assert not any(e["name"] == "wait" and e["pid"] == 0 and
                   e["args"].get("op", "").startswith("serve") for e in events)
    # what is left as its communication wait is a message with one named peer
    waits = {e["args"].get("op", "") for e in events if e["name"] == "wait" and e["pid"] == 0}
    assert waits and all(re.fullmatch(r"(recv [a-z ]+ from|send [a-z ]+ to) rank \d+", op)
                         for op in waits), sorted(waits)
    assert server[0]["wait"] > 0 and "idle" not in server[0]  # idle: traced, not a phase
    # the command line: exit 0, the first updates explained
    assert main(["replay", out, "--explain", "2"]) == 0
    said = capsys.readouterr().out
    assert "update 2 (server 0, version 1 -> 2): lr 0.05" in said
    assert "worker " in said and "staleness " in said and "pass 0, samples 0-7" in said
    # one parameter one ulp off: 1, naming it
    broken = str(tmp_path / "broken")
    shutil.copytree(out, broken)
    with np.load(f"{out}/model.npz") as saved:
        arrays = {k: saved[k] for k in saved.files}
    name = sorted(arrays)[-1]
    arrays[name].flat[3] = np.nextafter(arrays[name].flat[3], np.inf)
    np.savez(f"{broken}/model.npz", **arrays)
    outcome = replay(broken)
    assert outcome.status == 1
    assert f"first in '{name}' at index" in outcome.lines[-1]
    # what cannot be replayed: 2, and why
    for edit, why in [(lambda r: r["config"].update(strategy="sync"), "synchronous"),
                      (lambda r: r.update(resumed=[{"from_epoch": 1}]), "resumed"),
                      (lambda r: r["config"].update(reader="leader"), "node layout")]:
        with open(f"{out}/run.json") as f:
            record = json.load(f)
        edit(record)
        with open(f"{broken}/run.json", "w") as f:
            json.dump(record, f)
        outcome = replay(broken)
        assert outcome.status == 2 and why in outcome.lines[-1], outcome.lines
    os.remove(f"{broken}/events.json")
    shutil.copy(f"{out}/run.json", f"{broken}/run.json")
    assert replay(broken).status == 2
    world.Barrier()


@pytest.mark.parametrize("schedule", ["step", "cosine"])
def test_a_parameter_server_resumed_between_epochs_equals_the_uninterrupted_run(
        data_dir, tmp_path, schedule):
    # The server's rate is the schedule at its own clock (samples applied // (b x
    # workers)); with a constant rate a resume that lost the clock would pass. Three
    # epochs of a step (or cosine) schedule: the rate drops at each epoch's end. The
    # workers are taken in turn (round_robin), so the two runs apply the same gradients;
    # amsgd's momentum buffer at the server must come back too.
    settings = dict(schedule=schedule, epochs=3, momentum=0.5, checkpoint_every=1,
                    slowdown=None)
    options = {"order": "round_robin"}
    whole = train(data_dir, tmp_path / "whole", "amsgd", options, **settings)
    parts = train(data_dir, tmp_path / "parts", "amsgd", options, stop_after=1, **settings)
    if world.rank == 0:
        assert [json.loads(line)["epoch"] for line in open(f"{parts}/metrics.jsonl")] == [1]
        assert os.listdir(f"{parts}/checkpoints") == ["epoch-0001"]
    world.Barrier()
    train(data_dir, tmp_path / "parts", "amsgd", options, resume="yes", **settings)
    if world.rank == 0:
        with np.load(f"{whole}/model.npz") as a, np.load(f"{parts}/model.npz") as b:
            assert sorted(a.files) == sorted(b.files)
            for key in a.files:
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        lines = [json.loads(line) for line in open(f"{parts}/metrics.jsonl")]
        assert [m["epoch"] for m in lines] == [1, 2, 3]
    world.Barrier()
