"""Checkpoints: whose they are, rotation, and every check made before anything is restored."""

import dataclasses
import io
import json
import os
import shutil
import zipfile

import numpy as np
import pytest
from mpi4py import MPI

from minidp.comm import Topology
from minidp.io.nofollow import Directory
from minidp.run import checkpoint, owned, run_json, rundir
from minidp.run.compatible import checksum
from minidp.run.config import TrainConfig
from minidp.run.errors import UsageError
from minidp.run.state import STATE, state_problems
from minidp.trace import PHASES

WORLD = MPI.COMM_WORLD
CONFIG = dataclasses.asdict(TrainConfig(epochs=20))
EXPECTED = {"params": ((3,), np.dtype(np.float64))}


def row(epoch):
    """Epoch ``epoch``'s metrics, as the Trainer writes them."""
    return {"epoch": epoch, "train_loss": 1.0, "test_loss": None, "test_accuracy": 0.5,
            "wall_s": 2.0, "comm_s": 0.5, "samples": 64, "steps": 4,
            "phases": {p: 0.1 for p in PHASES}}


def save(out, run_id, epoch, arrays=None, config=None):
    """A checkpoint of the run ``run_id`` after ``epoch`` epochs (params = epoch, 3 times)."""
    arrays = {"params": np.full(3, float(epoch))} if arrays is None else arrays
    return checkpoint.save(str(out), run_id, epoch, Topology(WORLD), arrays, {"step": epoch},
                           {"strategy": "sync", "history": [row(e + 1) for e in range(epoch)],
                            "data": {}}, config or CONFIG)


def new_run(out):
    run = rundir.open_run(str(out), "no", False, WORLD)
    run_json.release(str(out), run.run_id)
    return run.run_id


def load(out, run_id, restore):
    return checkpoint.load(str(out), run_id, Topology(WORLD), CONFIG, EXPECTED,
                           lambda state, meta: [], restore)


def test_pruning_follows_write_order_not_epoch_numbers(tmp_path):
    run_id = new_run(tmp_path)
    for stale in (7, 8):  # an older minidp's checkpoints: no run id, never this run's
        d = tmp_path / "checkpoints" / f"epoch-{stale:04d}"
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"epoch": stale}))
    save(tmp_path, run_id, 1)
    save(tmp_path, run_id, 2)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["epoch-0001", "epoch-0002",
                                                           "epoch-0007", "epoch-0008"]
    save(tmp_path, run_id, 3)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["epoch-0002", "epoch-0003",
                                                           "epoch-0007", "epoch-0008"]
    metas = [json.loads((tmp_path / "checkpoints" / d / "meta.json").read_text())
             for d in ("epoch-0002", "epoch-0003")]
    assert [m["sequence"] for m in metas] == [2, 3]
    assert metas[1]["config"]["model"] == "lenet5" and metas[1]["run_id"] == run_id
    with Directory.open(str(tmp_path)) as run:
        assert [p.split(": ", 1)[1] for p in owned.survey_checkpoints(run, run_id).problems] == [
            "its meta.json has no run id, sequence or checksum (an older minidp's, or not "
            "minidp's)"] * 2


def test_rotation_and_resume_leave_a_users_copies_alone(tmp_path):
    """Issue 40: rotation deleted a user's copies kept beside the checkpoints, and --resume
    chose such a copy over minidp's own."""
    run_id = new_run(tmp_path)
    ck = tmp_path / "checkpoints"
    save(tmp_path, run_id, 1)
    save(tmp_path, run_id, 2)
    shutil.copytree(ck / "epoch-0002", ck / "epoch-0002-copy")
    shutil.copytree(ck / "epoch-0001", ck / "epoch-0001.bak")
    shutil.copytree(ck / "epoch-0001", ck / "best" / "epoch-0001")
    save(tmp_path, run_id, 3)
    (ck / "epoch-0003" / "notes.txt").write_text("the user's, inside minidp's checkpoint")
    save(tmp_path, run_id, 4)
    save(tmp_path, run_id, 5)
    assert sorted(os.listdir(ck)) == ["best", "epoch-0001.bak", "epoch-0002-copy", "epoch-0003",
                                      "epoch-0004", "epoch-0005"]
    assert sorted(os.listdir(ck / "epoch-0003")) == ["meta.json", "notes.txt", "rank-00000.npz"]
    assert owned.written(str(tmp_path), run_id) == [str(ck / f"epoch-{e:04d}")
                                                         for e in (3, 4, 5)]
    loaded = []
    meta = load(tmp_path, run_id, lambda m, a, s: loaded.append(a["params"].tolist()))
    assert (meta["name"], loaded) == ("epoch-0005", [[5.0] * 3])


def test_a_checkpoint_of_another_run_is_never_chosen(tmp_path):
    run_id, other = new_run(tmp_path / "run"), new_run(tmp_path / "other")
    save(tmp_path / "run", run_id, 1)
    save(tmp_path / "other", other, 9)
    shutil.copytree(tmp_path / "other" / "checkpoints" / "epoch-0009",
                    tmp_path / "run" / "checkpoints" / "epoch-0009")
    with pytest.raises(UsageError) as info:
        load(tmp_path / "run", run_id, lambda m, a, s: pytest.fail("restored"))
    assert str(info.value) == (
        f"--resume: '{tmp_path}/run/checkpoints/epoch-0009' is not a checkpoint of this run: it "
        f"was written by another run (run id {other!r}, this run's is {run_id!r}); minidp "
        "chooses only among the checkpoints it wrote and never removes what it did not write: "
        "move that away")


def reseal(path, **changes):
    meta = json.loads(open(path).read())
    meta.update(changes)
    meta["checksum"] = checksum(meta)
    open(path, "w").write(json.dumps(meta))


def rewrite(path, header_changes=None, **arrays):
    """The rank file at ``path`` with some arrays replaced (None: removed)."""
    with np.load(path) as f:
        kept = {k: f[k] for k in f.files}
    header = json.loads(bytes(kept["checkpoint"]).decode())
    header.update(header_changes or {})
    kept["checkpoint"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    kept.update(arrays)
    with open(path, "wb") as f:
        np.savez(f, **{k: v for k, v in kept.items() if v is not None})


def huge_header(path):
    """A params entry whose .npy header claims 8 TB (the zip itself is sound)."""
    with np.load(path) as f:
        kept = {k: f[k] for k in f.files if k != "params"}
    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f8", "fortran_order": False,
                                                  "shape": (10**12,)})
    with zipfile.ZipFile(path, "w") as z:
        for key, value in kept.items():
            with z.open(f"{key}.npy", "w") as m:
                np.lib.format.write_array(m, value)
        z.writestr("params.npy", buffer.getvalue() + bytes(24))


def flip_a_parameter(path):
    """One bit of the stored parameters (2.0, 2.0, 2.0) flipped: the zip's CRC-32 tells."""
    data = bytearray(open(path, "rb").read())
    data[data.index(np.full(3, 2.0).tobytes()) + 7] ^= 0x40
    open(path, "wb").write(bytes(data))


FORGERIES = {
    "format version": (lambda d, o: reseal(d / "meta.json", format=3),
                       "meta.json' is not a checkpoint record this minidp can continue: its "
                       "format version is 3; this minidp reads version 2"),
    "unknown key": (lambda d, o: reseal(d / "meta.json", surprise=1),
                    "meta.json' is not a checkpoint record this minidp can continue: it has "
                    "key(s) this minidp does not know: surprise"),
    "changed record": (lambda d, o: (d / "meta.json").write_text(
        (d / "meta.json").read_text().replace('"epoch": 2', '"epoch": 3')),
        "is not a checkpoint of this run: its meta.json does not match its checksum"),
    "rank file of another run": (lambda d, o: shutil.copy(o, d / "rank-00000.npz"),
                                 "rank-00000.npz': it belongs to another run (run_id "),
    "rank file of an earlier write": (None, "it belongs to another write of this checkpoint "
                                            "(sequence 2, this checkpoint's 3)"),
    "another shape": (lambda d, o: rewrite(d / "rank-00000.npz", params=np.zeros(1)),
                      "its array 'params' has shape (1,) and dtype float64, this run's has "
                      "shape (3,) and dtype float64"),
    "another dtype": (lambda d, o: rewrite(d / "rank-00000.npz",
                                           params=np.zeros(3, np.float32)),
                      "its array 'params' has shape (3,) and dtype float32"),
    "an array missing": (lambda d, o: rewrite(d / "rank-00000.npz", params=None),
                         "its entries are not this run's arrays; it lacks params"),
    "an array more": (lambda d, o: rewrite(d / "rank-00000.npz", extra=np.zeros(2)),
                      "its entries are not this run's arrays; this run has no extra"),
    "a header of 8 TB": (lambda d, o: huge_header(d / "rank-00000.npz"),
                         "its array 'params' has shape (1000000000000,)"),
    "another rank's file": (lambda d, o: rewrite(d / "rank-00000.npz", {"rank": 1}),
                            "it belongs to another rank (rank 1, this checkpoint's 0)"),
    "cut short": (lambda d, o: open(d / "rank-00000.npz", "r+b").truncate(300),
                  "it is unreadable (BadZipFile"),
    "a flipped bit": (lambda d, o: flip_a_parameter(d / "rank-00000.npz"),
                       "it is unreadable (BadZipFile: Bad CRC-32"),
    "a link": (lambda d, o: (os.remove(d / "rank-00000.npz"),
                             os.symlink(o, d / "rank-00000.npz")),
               "rank-00000.npz': it is a symbolic link, not a regular file that minidp wrote"),
    "a FIFO": (lambda d, o: (os.remove(d / "rank-00000.npz"), os.mkfifo(d / "rank-00000.npz")),
               "rank-00000.npz': it is a FIFO (named pipe), not a regular file"),
}


@pytest.mark.parametrize("forgery", FORGERIES)
def test_a_checkpoint_is_checked_before_anything_is_restored(tmp_path, forgery):
    """Issue 40: a rank file of another run, or with arrays of another shape, resumed; a
    checkpoint's format version and unknown keys were ignored."""
    run_id, other = new_run(tmp_path / "run"), new_run(tmp_path / "other")
    save(tmp_path / "run", run_id, 1)
    save(tmp_path / "other", other, 2)
    forge, message = FORGERIES[forgery]
    where = tmp_path / "run" / "checkpoints" / "epoch-0002"
    if forge is None:  # the same checkpoint written twice: the first write's rank file
        save(tmp_path / "run", run_id, 2)
        shutil.copy(where / "rank-00000.npz", tmp_path / "first.npz")
        save(tmp_path / "run", run_id, 2)
        shutil.copy(tmp_path / "first.npz", where / "rank-00000.npz")
    else:
        save(tmp_path / "run", run_id, 2)
        forge(where, tmp_path / "other" / "checkpoints" / "epoch-0002" / "rank-00000.npz")
    with pytest.raises(UsageError) as info:
        load(tmp_path / "run", run_id, lambda m, a, s: pytest.fail("restored"))
    assert message in str(info.value) and f"'{where}" in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_a_sound_checkpoint_loads_and_a_restore_that_fails_is_one_line(tmp_path):
    run_id = new_run(tmp_path)
    save(tmp_path, run_id, 1)
    loaded = []
    meta = load(tmp_path, run_id, lambda m, a, s: loaded.append((a["params"].tolist(), s)))
    assert loaded == [([1.0] * 3, {"step": 1})] and meta["sequence"] == 1

    def refuse(meta, arrays, state):
        raise KeyError("optimizer")
    with pytest.raises(UsageError, match=r"rank-00000.npz': it holds a state this run cannot "
                                         r"take \(KeyError: 'optimizer'\)"):
        load(tmp_path, run_id, refuse)


def good_state():
    return {"lr": 0.1, "optimizer_step": 3, "scheduler_step": 3, "dropout": [{}],
            "strategy": {}, "totals": {"elapsed_s": 1.5, "steps": 3, "bytes_intra": 10},
            "partial": {"batch": 2, "loss_sum": 0.5, "steps": 2, "samples": 32}}


@pytest.mark.parametrize("change, problem", [
    ({"lr": "0.1"}, "its state has no valid lr"),
    ({"optimizer_step": True}, "its state has no valid optimizer_step"),
    ({"dropout": [1]}, "its state has no valid dropout"),
    ({"totals": {"elapsed_s": 1.0}}, "its state has no valid totals"),
    ({"partial": {"batch": -1, "loss_sum": 0.5, "steps": 2, "samples": 32}},
     "its state has no valid partial"),
    ({"partial": None}, "its state stopped at batch 0, its checkpoint at batch 2"),
    ({"dropout": []}, "its state has 0 dropout generator(s), this model has 1"),
    ({"surprise": 1}, "its state's keys are"),
])
def test_a_rank_files_state_is_checked_key_by_key(change, problem):
    meta = {"batch": 2}
    assert state_problems(good_state(), meta, 1) == []
    assert problem in state_problems(dict(good_state(), **change), meta, 1)[0]
    assert set(good_state()) == set(STATE)


def resumable(**now):
    saved = dataclasses.asdict(TrainConfig(batch_size=16, epochs=4).check())
    return {"epoch": 2, "world_size": 2, "config": saved}, dict(saved, **now)


def test_resume_lists_every_difference_with_both_values():
    meta, now = resumable(batch_size=32, momentum=0.5, options={"k": 2})
    with pytest.raises(UsageError) as info:
        checkpoint.check_resumable(meta, now, 2, "ck")
    assert str(info.value) == ("--resume: cannot continue checkpoint 'ck': sync.k: checkpoint "
                               "'(unset)', now 2; --batch-size: checkpoint 16, now 32; "
                               "--momentum: checkpoint 0.9, now 0.5")
    checkpoint.check_resumable(*resumable(lr=0.001), 2, "ck")  # a lower --lr may continue it


def identity(header=0x1234ABCD, payload=(7, 9), path="data/s-train.mdp"):
    file = {"path": path, "header_checksum": header, "payload_checksum": list(payload)}
    return {"train": file, "test": dict(file, path=path.replace("train", "test"))}


def test_resume_refuses_other_dataset_files_naming_them():
    meta, now = resumable()
    meta["data"] = identity()
    checkpoint.check_resumable(meta, now, 2, "ck", identity(path="moved/s-train.mdp"))
    with pytest.raises(UsageError) as info:
        checkpoint.check_resumable(meta, now, 2, "ck", dict(identity(), train=identity(
            header=0x55, payload=(7, 10), path="other/s-train.mdp")["train"]))
    assert str(info.value) == (
        "--resume: cannot continue checkpoint 'ck': train data file 'other/s-train.mdp' (the "
        "checkpoint's was 'data/s-train.mdp') is another file than the checkpoint's: header "
        "checksum: checkpoint 305441741, now 85, payload checksum (S1, S2): checkpoint [7, 9], "
        "now [7, 10]")
    del meta["data"]  # an older minidp's checkpoint cannot tell
    with pytest.raises(UsageError, match="records no dataset files' checksums"):
        checkpoint.check_resumable(meta, now, 2, "ck", identity())


@pytest.mark.parametrize("now, world, message", [
    ({"epochs": 2}, 2, "the run is complete (checkpoint at epoch 2, --epochs 2); allowed: "
                       "--epochs above 2"),
    ({"epochs": 1}, 2, "the run is complete (checkpoint at epoch 2, --epochs 1)"),
    ({"epochs": 6, "schedule": "cosine"}, 2, "--epochs: checkpoint 4, now 6, but --schedule "
                                             "cosine counts its steps from the total"),
    ({"strategy": "hsgd", "options": {}}, 3, "world size: checkpoint 2 ranks, now 3; strategy "
                                             "'hsgd' keeps a different state on every rank"),
])
def test_resume_refusals(now, world, message):
    meta, config = resumable(**now)
    if now.get("strategy"):
        meta["config"]["strategy"] = now["strategy"]
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        checkpoint.check_resumable(meta, config, world, "ck")


def test_resume_may_grow_epochs_and_change_world_size_for_sync():
    meta, now = resumable(epochs=9)
    checkpoint.check_resumable(meta, now, 3, "ck")
