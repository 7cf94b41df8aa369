"""Run directories, run.json, checkpoint pruning and the resume checks (one process)."""

import dataclasses
import json
import os

import numpy as np
import pytest
from mpi4py import MPI

from minidp.comm import Topology
from minidp.run import checkpoint, rundir
from minidp.run.config import TrainConfig
from minidp.run.errors import UsageError

WORLD = MPI.COMM_WORLD


def test_numbered_directories_and_latest(tmp_path):
    base = str(tmp_path / "runs")
    assert rundir.new_run_dir(base) == os.path.join(base, "0001")
    assert rundir.new_run_dir(base) == os.path.join(base, "0002")
    assert os.readlink(os.path.join(base, "latest")) == "0002"
    os.mkdir(os.path.join(base, "0007"))
    os.mkdir(os.path.join(base, "0009x"))  # not a number: ignored
    assert rundir.new_run_dir(base) == os.path.join(base, "0008")
    assert os.readlink(os.path.join(base, "latest")) == "0008"
    assert sorted(os.listdir(base)) == ["0001", "0002", "0007", "0008", "0009x", "latest"]


def test_an_older_latest_directory_is_left_alone(tmp_path):
    base = tmp_path / "runs"
    (base / "latest").mkdir(parents=True)
    (base / "latest" / "run.json").write_text("{}")
    path, resuming = rundir.open_run(None, "no", False, WORLD, base=str(base))
    assert (path, resuming) == (str(base / "0001"), False)
    assert (base / "latest").is_dir() and not (base / "latest").is_symlink()
    assert (base / "latest" / "run.json").read_text() == "{}"


def test_reused_out_is_refused_and_overwrite_clears_only_run_files(tmp_path, capsys):
    out = tmp_path / "run"
    rundir.claim(str(out))  # a run of minidp's: its run.json holds the claim
    (out / "checkpoints" / "epoch-0001").mkdir(parents=True)
    (out / "checkpoints" / "epoch-0002.tmp").mkdir()
    (out / "checkpoints" / "resnet50_epoch90.pt").write_text("the user's")
    for name in ("metrics.jsonl", "trace.json", "notes.txt"):
        (out / name).write_text("x")
    with pytest.raises(UsageError) as info:
        rundir.open_run(str(out), "no", False, WORLD)
    assert str(info.value) == (
        f"--out '{out}' holds another run (run.json, metrics.jsonl, checkpoints, trace.json; "
        f"pid {os.getpid()} on host {os.uname().nodename} at "
        f"{rundir.read_run_json(str(out))[rundir.MARKER]['time']}); pass --resume to continue "
        "it, --overwrite to replace it, or no --out for a new directory under runs/")
    assert rundir.open_run(str(out), "no", True, WORLD) == (str(out), False)
    assert sorted(os.listdir(out)) == ["checkpoints", "notes.txt", "run.json"]
    assert os.listdir(out / "checkpoints") == ["resnet50_epoch90.pt"]
    assert rundir.read_run_json(str(out))[rundir.MARKER]["pid"] == os.getpid()  # claimed anew
    assert "--overwrite: removing run.json, metrics.jsonl, checkpoints, trace.json" in \
        capsys.readouterr().out


def users_directory(out):
    """What issue 29 found deleted: a user's files under minidp's names, no run.json."""
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "resnet50_epoch90.pt").write_text("90 epochs of someone's work")
    (out / "summary.json").write_text('{"top1": 76.1}')
    return sorted(str(p) for p in out.rglob("*"))


@pytest.mark.parametrize("resume, overwrite", [("auto", False), ("no", True), ("no", False)])
def test_nothing_minidp_did_not_write_is_deleted(tmp_path, resume, overwrite):
    out = tmp_path / "run"
    before = users_directory(out)
    with pytest.raises(UsageError) as info:
        rundir.open_run(str(out), resume, overwrite, WORLD)
    assert str(info.value) == (f"--out '{out}' holds summary.json, checkpoints but no run of "
                               "minidp's (its run.json is missing or not minidp's), and minidp "
                               "deletes only what it wrote; move them away, or choose another "
                               "--out")
    assert sorted(str(p) for p in out.rglob("*")) == before
    (out / "run.json").write_text('{"config": {}}')  # a run.json, but not minidp's claim
    with pytest.raises(UsageError, match="holds run.json, summary.json, checkpoints but no run"):
        rundir.open_run(str(out), resume, overwrite, WORLD)


def test_resume_auto_never_deletes_a_run_without_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    rundir.claim(str(out))
    (out / "summary.json").write_text("{}")  # a finished run, no --checkpoint-every
    with pytest.raises(UsageError, match=rf"--resume auto: '{out}' holds a run of minidp's "
                                         rf"\(pid {os.getpid()} .*: run.json, summary.json\) "
                                         "with no complete checkpoint to continue; --resume auto "
                                         "never deletes: pass --overwrite"):
        rundir.open_run(str(out), "auto", False, WORLD)
    assert sorted(os.listdir(out)) == ["run.json", "summary.json"]


def claim_at_once(out, ready, results):
    """A forked process: wait for the start, then open ``out`` as a job's rank 0 does."""
    from mpi4py import MPI

    ready.wait()
    try:
        rundir.open_run(out, "no", False, MPI.COMM_SELF)
        results.put((os.getpid(), "claimed"))
    except UsageError as exc:
        results.put((os.getpid(), str(exc)))


def test_two_jobs_started_together_on_one_out_one_claims_it_20_times(tmp_path):
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    for trial in range(20):
        out = str(tmp_path / f"race-{trial}")
        ready, results = fork.Event(), fork.Queue()
        jobs = [fork.Process(target=claim_at_once, args=(out, ready, results)) for _ in "ab"]
        for job in jobs:
            job.start()
        ready.set()  # both at once
        outcomes = dict(results.get(timeout=60) for _ in jobs)
        for job in jobs:
            job.join(60)
        winner = [pid for pid, what in outcomes.items() if what == "claimed"]
        assert len(winner) == 1, outcomes
        loser = next(what for what in outcomes.values() if what != "claimed")
        claimed = rundir.read_run_json(out)[rundir.MARKER]
        assert claimed["pid"] == winner[0]
        who = f"pid {winner[0]} on host {claimed['host']} at {claimed['time']}"
        assert loser in (f"--out '{out}' was claimed by another job ({who}, from its run.json); "
                         "wait for it to end, or choose another --out",
                         f"--out '{out}' holds another run (run.json; {who}); pass --resume to "
                         "continue it, --overwrite to replace it, or no --out for a new "
                         "directory under runs/"), loser


def test_resume_choices(tmp_path):
    out, base = tmp_path / "run", str(tmp_path / "runs")
    with pytest.raises(UsageError, match="--resume: no complete checkpoint in '.*checkpoints'"):
        rundir.open_run(str(out), "yes", False, WORLD, base=base)
    assert rundir.open_run(str(out), "auto", False, WORLD, base=base) == (str(out), False)
    (out / "checkpoints" / "epoch-0002").mkdir(parents=True)
    (out / "checkpoints" / "epoch-0002" / "meta.json").write_text("{}")
    assert rundir.open_run(str(out), "auto", False, WORLD, base=base) == (str(out), True)
    assert rundir.open_run(str(out), "yes", False, WORLD, base=base) == (str(out), True)
    with pytest.raises(UsageError, match="--resume auto: needs --out DIR"):
        rundir.open_run(None, "auto", False, WORLD, base=base)
    with pytest.raises(UsageError, match="no --out given and '.*latest' does not exist"):
        rundir.open_run(None, "yes", False, WORLD, base=base)
    first, _ = rundir.open_run(None, "no", False, WORLD, base=base)
    os.makedirs(os.path.join(first, "checkpoints", "epoch-0001"))
    open(os.path.join(first, "checkpoints", "epoch-0001", "meta.json"), "w").close()
    assert rundir.open_run(None, "yes", False, WORLD, base=base) == (first, True)


def test_run_json_records_the_start_and_every_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    config = {"model": "mlp", "epochs": 2}
    rundir.write_run_json(str(tmp_path), config, WORLD, 1)
    first = json.loads((tmp_path / "run.json").read_text())
    assert first["config"] == config and first["world_size"] == 1
    assert first["ranks_per_node"] == 1 and first["slurm_job_id"] == "4242"
    assert first["hosts"] == [os.uname().nodename]
    assert first["mpi_library"] and "\x00" not in first["mpi_library"]
    assert first["start_time"].endswith("+00:00")
    assert first["git_commit"] is None or len(first["git_commit"]) == 40
    assert first[rundir.MARKER]["pid"] == os.getpid()
    rundir.write_run_json(str(tmp_path), dict(config, epochs=4), WORLD, 1, resumed_from=2)
    rundir.write_run_json(str(tmp_path), dict(config, epochs=4, lr=0.01), WORLD, 1,
                          resumed_from=3)
    again = json.loads((tmp_path / "run.json").read_text())
    assert again["start_time"] == first["start_time"] and again["config"] == config
    assert again[rundir.MARKER] == first[rundir.MARKER]
    assert [(r["from_epoch"], r["config"]["epochs"], r["changed"]) for r in again["resumed"]] \
        == [(2, 4, {"epochs": [2, 4]}), (3, 4, {"lr": [None, 0.01]})]
    assert [n for n in os.listdir(tmp_path) if "tmp" in n] == []


def test_git_commit_is_none_outside_a_work_tree(tmp_path):
    assert rundir.git_commit(str(tmp_path)) is None


def save(out, epoch, config=None):
    arrays = {"params": np.full(3, float(epoch))}
    return checkpoint.save(str(out), epoch, Topology(WORLD), arrays, {"step": epoch},
                           {"history": []}, config or dataclasses.asdict(TrainConfig()))


def test_pruning_follows_write_order_not_epoch_numbers(tmp_path):
    for stale in (7, 8):  # an older minidp's checkpoints: no sequence recorded
        d = tmp_path / "checkpoints" / f"epoch-{stale:04d}"
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"epoch": stale}))
    save(tmp_path, 1)
    save(tmp_path, 2)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["epoch-0001", "epoch-0002"]
    save(tmp_path, 3)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["epoch-0002", "epoch-0003"]
    metas = [json.loads((tmp_path / "checkpoints" / d / "meta.json").read_text())
             for d in ("epoch-0002", "epoch-0003")]
    assert [m["sequence"] for m in metas] == [2, 3]
    assert metas[1]["config"]["model"] == "lenet5"


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


def test_bad_checkpoint_is_one_line_naming_the_file(tmp_path):
    config = dataclasses.asdict(TrainConfig())
    final = save(tmp_path, 1, config)
    topology = Topology(WORLD)
    loaded = []
    checkpoint.load(str(tmp_path), topology, config, lambda m, a, s: loaded.append(a["params"]))
    assert loaded[0].tolist() == [1.0, 1.0, 1.0]
    with pytest.raises(UsageError, match=r"'.*rank-00000.npz' has no 'optimizer'"):
        checkpoint.load(str(tmp_path), topology, config, lambda m, a, s: a["optimizer"])
    path = os.path.join(final, "rank-00000.npz")
    whole = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(whole[:len(whole) // 2])  # truncated
    with pytest.raises(UsageError, match=r"rank-00000.npz' is unreadable \(BadZipFile"):
        checkpoint.load(str(tmp_path), topology, config, lambda m, a, s: None)
    with open(os.path.join(final, "meta.json"), "w") as f:
        f.write(json.dumps({"epoch": 1, "world_size": 1, "history": []}))
    with pytest.raises(UsageError, match="meta.json' is not a usable checkpoint record: no "
                                         r"valid config \(a checkpoint of an older minidp"):
        checkpoint.load(str(tmp_path), topology, config, lambda m, a, s: None)


def test_a_run_directory_removed_mid_run_is_one_error_naming_the_file(tmp_path):
    import shutil

    from minidp.run.files import RunFiles

    out = tmp_path / "run"
    rundir.claim(str(out))
    files = RunFiles(str(out), 0, WORLD)
    files.start_metrics([])
    files.append_metrics({"epoch": 1, "test_loss": float("nan")})
    assert (out / "metrics.jsonl").read_text() == '{"epoch": 1, "test_loss": null}\n'
    shutil.rmtree(out)  # a user's rm -r, or a scratch file system's purge
    with pytest.raises(OSError) as failed:
        files.append_metrics({"epoch": 2})
    assert str(failed.value) == (f"rank 0: cannot write '{out}/metrics.jsonl': No such file or "
                                 "directory (ENOENT)")
    with pytest.raises(OSError) as failed:
        files.write_results({"w": np.zeros(2)}, {"final": float("inf")})
    assert str(failed.value) == (f"rank 0: cannot write '{out}/model.npz': No such file or "
                                 "directory (ENOENT)")
