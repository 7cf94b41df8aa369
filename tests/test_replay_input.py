"""``minidp replay`` on what a hostile user or a damaged disk leaves: 2, never 1, never a crash.

Two real runs (``asgd``: 1 server, 2 workers; ``easgd-async``: a master, 2 workers) are
trained once; each case copies one, damages one file, and replays the copy in this
process. Exit status 1 must mean only that the run did not follow its rule: a file that
is not what minidp writes (a FIFO, not JSON, a row of another length, a worker that does
not exist, a model that is no archive) and a dataset file that changed since the run are
2 ("cannot replay", and why); a failure of the replay itself is 70, with its traceback.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from spmd import ROOT, run_spmd

from minidp.__main__ import main
from minidp.io.mdp import HEADER_SIZE
from minidp.replay import replay
from minidp.replay.servers import ServersReplay

pytestmark = pytest.mark.xdist_group("replay_input")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{strategy: run directory} of two finished asynchronous runs, and their data."""
    root = tmp_path_factory.mktemp("runs")
    data = str(root / "data")
    subprocess.run([sys.executable, "-m", "minidp", "data", "prepare", "synthetic", "--out",
                    data, "--data-dir", data, "--quiet"], cwd=ROOT, check=True,
                   capture_output=True)
    found = {"data": data}
    for strategy in ("asgd", "easgd-async"):
        out = str(root / strategy)
        launch = run_spmd(["-m", "minidp", "train", "--strategy", strategy, "--model", "mlp",
                           "--dataset", "synthetic", "--data-dir", data, "--train-samples",
                           "192", "--test-samples", "64", "--batch-size", "16", "--epochs",
                           "2", "--dtype", "float64", "--no-progress", "--out", out], 3,
                          timeout=240)
        assert launch.returncode == 0, launch.output
        found[strategy] = out
    return found


def copy(runs, strategy, tmp_path):
    target = str(tmp_path / strategy)
    shutil.copytree(runs[strategy], target)
    return target


def edit_json(path, change):
    with open(path) as f:
        record = json.load(f)
    change(record)
    with open(path, "w") as f:
        json.dump(record, f)


def rows(record, rank):
    return record["ranks"][rank]["rows"]


@pytest.mark.parametrize("strategy", ["asgd", "easgd-async"])
def test_the_untouched_runs_replay_equal(runs, strategy):
    outcome = replay(runs[strategy])
    assert outcome.status == 0, outcome.lines
    assert outcome.lines[-1].startswith("result: equal to model.npz bit for bit")


# (strategy, file, how it is damaged, what the refusal says after "cannot replay RUN: ")
CASES = [
    ("asgd", "run.json", lambda p: open(p, "w").write("{\"config\": "),
     "run.json: '{run}/run.json' is not valid JSON"),
    ("asgd", "run.json", lambda p: edit_json(p, lambda r: r.update(config=[1])),
     "run.json: '{run}/run.json', 'config': got [1] (an array), allowed: a JSON object"),
    ("asgd", "run.json", lambda p: edit_json(p, lambda r: r["config"].update(seed="0")),
     "run.json: '{run}/run.json', 'config': 'seed' is \"0\" (a string), allowed: an int >= 0"),
    ("asgd", "run.json", lambda p: edit_json(p, lambda r: r["config"].pop("lr")),
     "run.json: '{run}/run.json', 'config': no 'lr', allowed: a record that has it"),
    ("easgd-async", "run.json",
     lambda p: edit_json(p, lambda r: r["config"]["options"].update(tau=0)),
     "run.json: '{run}/run.json', 'config', 'options': 'tau' is 0 (int), allowed: an int >= 1"),
    ("asgd", "summary.json",
     lambda p: edit_json(p, lambda r: r.update(batches_per_epoch="6")),
     "summary.json: '{run}/summary.json': 'batches_per_epoch' is \"6\" (a string), allowed: "
     "an int >= 1"),
    ("asgd", "events.json", lambda p: open(p, "w").write("{\"format\": 1, \"ra"),
     "events.json: '{run}/events.json' is not valid JSON"),
    ("asgd", "events.json", lambda p: edit_json(p, lambda r: rows(r, 1)[0].append(0)),
     "events.json: '{run}/events.json', rank 1, row 0: got [0, 16, 0, 0], allowed: epoch in "
     "[0, 1], samples >= 0, version_0 >= 0"),
    ("asgd", "events.json", lambda p: edit_json(p, lambda r: rows(r, 0)[0].__setitem__(0, 7)),
     "events.json: '{run}/events.json', rank 0, row 0: got [7, "),
    ("asgd", "events.json", lambda p: edit_json(p, lambda r: rows(r, 0)[0].__setitem__(1, 9)),
     "events.json: '{run}/events.json', rank 0, row 0: got [0, 9, "),
    ("asgd", "events.json", lambda p: edit_json(p, lambda r: rows(r, 0).append([0, 1, 0, 16])),
     "events.json: '{run}/events.json': worker 1 took "),  # N steps, server 0 records N + 1
    ("asgd", "events.json", lambda p: edit_json(p, lambda r: r["ranks"][2].update(role="server")),
     "events.json: '{run}/events.json', rank 2: got rank 2, role 'server', columns"),
    ("asgd", "events.json", lambda p: edit_json(p, lambda r: r.update(strategy="amsgd")),
     "events.json: '{run}/events.json' is not this run's (format 1 of 'amsgd' on 3 ranks"),
    ("asgd", "events.json", lambda p: edit_json(p, lambda r: rows(r, 1)[0].__setitem__(1, 10**9)),
     "events.json: a step of 1000000000 samples, allowed: at most the 192 training samples"),
    ("easgd-async", "events.json", lambda p: edit_json(p, lambda r: rows(r, 0).pop()),
     "events.json: '{run}/events.json': worker "),
    ("easgd-async", "events.json",
     lambda p: edit_json(p, lambda r: rows(r, 0)[0].__setitem__(0, 0)),
     "events.json: '{run}/events.json', rank 0: an event of rank 0, allowed: a worker's rank "
     "(1 or more)"),
    ("asgd", "model.npz", lambda p: open(p, "wb").write(b"PK\x03\x04 not a zip at all"),
     "model.npz: '{run}/model.npz' is not the NumPy archive of arrays minidp writes"),
    ("asgd", "model.npz", lambda p: np.save(open(p, "wb"), np.zeros(3)),
     "model.npz: '{run}/model.npz' is not the NumPy archive of arrays minidp writes (one "
     "array, not an archive)"),
    ("asgd", "model.npz", lambda p: np.savez(open(p, "wb"), w=np.array([{}], dtype=object)),
     "model.npz: '{run}/model.npz' is not the NumPy archive of arrays minidp writes "
     "(ValueError: Object arrays cannot be loaded when allow_pickle=False"),
    ("asgd", "model.npz", lambda p: os.truncate(p, os.path.getsize(p) // 2),
     "model.npz: '{run}/model.npz' is not the NumPy archive of arrays minidp writes"),
]


@pytest.mark.parametrize("strategy, name, damage, message", CASES,
                         ids=[f"{c[0]}-{c[1]}-{k}" for k, c in enumerate(CASES)])
def test_a_file_that_does_not_check_is_cannot_replay_not_differs(runs, tmp_path, strategy,
                                                                  name, damage, message):
    run = copy(runs, strategy, tmp_path)
    damage(os.path.join(run, name))
    outcome = replay(run)
    assert outcome.status == 2, outcome.lines
    assert outcome.lines[-1].startswith(f"replay: cannot replay {run}: "
                                        + message.replace("{run}", run)), outcome.lines


def test_a_damaged_dataset_file_is_cannot_replay_not_differs(runs, tmp_path):
    data = str(tmp_path / "data")
    shutil.copytree(runs["data"], data)
    path = os.path.join(data, "synthetic-train.mdp")
    with open(path, "r+b") as f:  # one payload byte: the samples, not the header, change
        f.seek(HEADER_SIZE + 100)
        byte = f.read(1)
        f.seek(HEADER_SIZE + 100)
        f.write(bytes([byte[0] ^ 0x55]))
    outcome = replay(runs["asgd"], data_dir=data)
    assert outcome.status == 2, outcome.lines
    assert outcome.lines[-1].startswith(f"replay: cannot replay {runs['asgd']}: dataset file "
                                        f"'{path}': checksum mismatch over payload bytes")
    assert outcome.lines[-1].endswith("; give the file the run trained on with --data-dir")


def test_well_formed_events_a_rule_cannot_give_are_differs(runs, tmp_path):
    # The one 1 that is not about model.npz: the run counted a staleness its versions do
    # not give (what a server that miscounts would record).
    run = copy(runs, "asgd", tmp_path)

    def miscount(record):
        last = [row for row in rows(record, 0) if row[0] == 0][-1]  # the last gradient
        last[2] += 1

    edit_json(os.path.join(run, "events.json"), miscount)
    outcome = replay(run)
    assert outcome.status == 1, outcome.lines
    assert "result: the run does not follow its rule: server 0's gradient" in outcome.lines[-1]


@pytest.mark.parametrize("name", ["run.json", "summary.json", "events.json", "model.npz"])
def test_a_fifo_in_the_run_is_refused_not_waited_on(runs, tmp_path, name):
    run = copy(runs, "asgd", tmp_path)
    os.remove(os.path.join(run, name))
    os.mkfifo(os.path.join(run, name))
    done = subprocess.run([sys.executable, "-m", "minidp", "replay", run], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"replay: cannot replay {run}: {name}: '{run}/{name}' is a FIFO (named pipe), not a "
        "regular file (minidp writes regular files there)")


def test_a_crash_of_the_replay_itself_is_70_with_its_traceback(runs, capsys, monkeypatch):
    def broken(self, worker, step):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(ServersReplay, "take_gradient", broken)
    assert main(["replay", runs["asgd"]]) == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError: a bug" in err
    assert err.strip().splitlines()[-1] == (
        f"replay: internal error while replaying {runs['asgd']} (a bug in minidp, not a "
        "verdict on the run: please report it with the traceback above; exit status 70)")
