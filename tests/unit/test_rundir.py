"""Run directories, claims and run.json (one process; other jobs are forked processes)."""

import json
import os

import numpy as np
import pytest
from mpi4py import MPI
from test_checkpoints import save

from minidp.io.nofollow import Directory
from minidp.run import claim, owned, run_json, rundir
from minidp.run.errors import UsageError
from minidp.run.files import RunFiles

WORLD = MPI.COMM_WORLD
HOST = os.uname().nodename
RUN_ID = "0123456789abcdef"


def opened(out, resume="no", overwrite=False, **kwargs):
    """open_run at one rank: the directory is claimed by this process."""
    return rundir.open_run(str(out), resume, overwrite, WORLD, **kwargs)


def released(out, resume="no", overwrite=False):
    """A run of minidp's in ``out`` whose job has ended (its claim released)."""
    run = opened(out, resume, overwrite)
    run_json.release(str(out), run.run_id)
    return run


def test_numbered_directories_and_latest(tmp_path, capsys):
    base = str(tmp_path / "runs")
    assert rundir.new_run_dir(base) == os.path.join(base, "0001")
    assert rundir.new_run_dir(base) == os.path.join(base, "0002")
    assert os.readlink(os.path.join(base, "latest")) == "0002"
    os.mkdir(os.path.join(base, "0007"))
    os.mkdir(os.path.join(base, "0009x"))  # not a number: ignored
    assert rundir.new_run_dir(base) == os.path.join(base, "0008")
    assert os.readlink(os.path.join(base, "latest")) == "0008"
    assert sorted(os.listdir(base)) == ["0001", "0002", "0007", "0008", "0009x", "latest"]
    # a user's link named latest (not to a run beside it) is theirs: left, never followed
    os.remove(os.path.join(base, "latest"))
    os.symlink(str(tmp_path), os.path.join(base, "latest"))
    assert rundir.new_run_dir(base) == os.path.join(base, "0009")
    assert os.readlink(os.path.join(base, "latest")) == str(tmp_path)
    assert "note: '" + base + "/latest' is not minidp's link (it is a symbolic link)" in \
        capsys.readouterr().err
    with pytest.raises(UsageError, match=rf"no --out given, and '{base}/latest' is a link to "
                                         rf"'{tmp_path}', not minidp's link"):
        rundir.open_run(None, "yes", False, WORLD, base=base)


def test_an_older_latest_directory_is_left_alone(tmp_path):
    base = tmp_path / "runs"
    (base / "latest").mkdir(parents=True)
    (base / "latest" / "run.json").write_text("{}")
    run = rundir.open_run(None, "no", False, WORLD, base=str(base))
    assert (run.path, run.resuming) == (str(base / "0001"), False)
    assert (base / "latest").is_dir() and not (base / "latest").is_symlink()
    assert (base / "latest" / "run.json").read_text() == "{}"


def test_reused_out_is_refused_and_overwrite_clears_only_run_files(tmp_path, capsys):
    out = tmp_path / "run"
    first = released(out)
    save(out, first.run_id, 1)
    (out / "checkpoints" / "epoch-0002.tmp").mkdir()  # an old-style name: not this run's
    (out / "checkpoints" / "resnet50_epoch90.pt").write_text("the user's")
    for name in ("metrics.jsonl", "trace.json", "notes.txt", "summary.json.tmp-mine"):
        (out / name).write_text("x")
    (out / f"model.npz.tmp-{first.run_id}").write_text("a killed write of this run's")
    holder = run_json.read_run_json(str(out))[claim.MARKER]
    with pytest.raises(UsageError) as info:
        opened(out)
    assert str(info.value) == (
        f"--out '{out}' holds another run (run.json, metrics.jsonl, checkpoints, trace.json; "
        f"pid {os.getpid()} on host {HOST} (started {holder['started']})); pass --resume to "
        "continue it, --overwrite to replace it, or no --out for a new directory under runs/")
    second = opened(out, overwrite=True)
    assert second.resuming is False and second.run_id != first.run_id  # a new run
    assert sorted(os.listdir(out)) == ["checkpoints", "notes.txt", "run.json",
                                       "summary.json.tmp-mine"]
    assert sorted(os.listdir(out / "checkpoints")) == ["epoch-0002.tmp", "resnet50_epoch90.pt"]
    assert run_json.read_run_json(str(out))[claim.MARKER]["run_id"] == second.run_id
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
        opened(out, resume, overwrite)
    assert str(info.value) == (f"--out '{out}' holds summary.json, checkpoints but no run of "
                               "minidp's (its run.json is missing), and minidp touches only what "
                               "it wrote; move them away, or choose another --out")
    assert sorted(str(p) for p in out.rglob("*")) == before
    (out / "run.json").write_text('{"config": {}}')  # a run.json, but not minidp's claim
    with pytest.raises(UsageError, match=r"holds run.json, summary.json, checkpoints but no run "
                                         r"of minidp's \('.*run.json' holds no claim of minidp's"):
        opened(out, resume, overwrite)


def test_resume_auto_never_deletes_a_run_without_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    released(out)
    (out / "summary.json").write_text("{}")  # a finished run, no --checkpoint-every
    with pytest.raises(UsageError, match=rf"--resume auto: '{out}' holds a run of minidp's "
                                         rf"\(pid {os.getpid()} .*: run.json, summary.json\) "
                                         "with no complete checkpoint to continue; --resume auto "
                                         "never deletes: pass --overwrite"):
        opened(out, "auto")
    assert sorted(os.listdir(out)) == ["run.json", "summary.json"]


def test_resume_choices(tmp_path):
    out, base = tmp_path / "run", str(tmp_path / "runs")
    with pytest.raises(UsageError, match="--resume: no complete checkpoint in '.*checkpoints'"):
        opened(out, "yes", base=base)
    run = opened(out, "auto", base=base)
    assert run.resuming is False
    with pytest.raises(UsageError, match=r"--resume: no complete checkpoint of the run in"):
        opened(out, "yes", base=base)
    save(out, run.run_id, 2)
    assert opened(out, "auto", base=base) == (str(out), True, run.run_id)
    assert opened(out, "yes", base=base) == (str(out), True, run.run_id)
    with pytest.raises(UsageError, match="--resume auto: needs --out DIR"):
        rundir.open_run(None, "auto", False, WORLD, base=base)
    with pytest.raises(UsageError, match="no --out given and '.*latest' does not exist"):
        rundir.open_run(None, "yes", False, WORLD, base=base)
    first = rundir.open_run(None, "no", False, WORLD, base=base)
    save(first.path, first.run_id, 1)
    assert rundir.open_run(None, "yes", False, WORLD, base=base) == (first.path, True,
                                                                     first.run_id)
    assert rundir.resumable(None, "yes", base=base) == os.path.join(first.path, "checkpoints",
                                                                    "epoch-0001")


@pytest.mark.parametrize("planted", ["summary.json/", "metrics.jsonl@", "checkpoints@",
                                     "model.npz|", "trace-parts@", "checkpoints/epoch-0007@",
                                     "checkpoints/epoch-0003", "run.json.tmp-RUN@"])
def test_what_minidp_did_not_write_under_its_names_is_refused_never_touched(tmp_path, planted):
    """Issue 40: --overwrite removed directories under minidp's names, and a link planted
    in the run directory was followed. Now every flag refuses, naming it, touching nothing."""
    out, outside = tmp_path / "run", tmp_path / "outside"
    run = released(out)
    save(out, run.run_id, 1)
    (outside / "checkpoints").mkdir(parents=True)
    (outside / "checkpoints" / "keep.txt").write_text("outside the run")
    target = out / planted[:-1].replace("RUN", run.run_id) if planted[-1] in "/@|" else \
        out / planted
    if planted.endswith("/"):
        (target / "mine").mkdir(parents=True)
    elif planted.endswith("@"):
        if target.exists():
            os.rename(target, tmp_path / "moved")
        target.symlink_to(outside / "checkpoints")
    elif planted.endswith("|"):
        os.mkfifo(target)
    else:  # a checkpoint of another run under minidp's name
        other = released(tmp_path / "other")
        save(tmp_path / "other", other.run_id, 3)
        os.rename(tmp_path / "other" / "checkpoints" / "epoch-0003", target)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    for resume, overwrite in (("no", True), ("auto", False), ("yes", False)):
        with pytest.raises(UsageError) as info:
            opened(out, resume, overwrite)
        assert f"'{target}' is " in str(info.value) and "\n" not in str(info.value)
        assert sorted(str(p) for p in tmp_path.rglob("*")) == before
    assert (outside / "checkpoints" / "keep.txt").read_text() == "outside the run"


def test_an_unwritable_out_is_one_line_naming_it_and_what_to_do(tmp_path):
    """Issue 40: an unwritable --out printed a raw errno."""
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError) as info:
        opened(tmp_path / "file" / "run")
    assert str(info.value) == (f"--out '{tmp_path}/file/run': cannot create or write the run "
                               f"directory ('{tmp_path}/file/run': Not a directory (ENOTDIR)); "
                               "a part of that path is a file, not a directory: choose another "
                               "--out")
    if os.path.isdir("/sys/kernel"):  # sysfs refuses a new directory, even to root
        with pytest.raises(UsageError, match=r"--out '/sys/kernel/minidp-run': cannot create or "
                                             r"write the run directory \('/sys/kernel/minidp-run'"
                                             r": (Operation not permitted \(EPERM\)|Permission "
                                             r"denied \(EACCES\))\); choose a --out where you may "
                                             r"write"):
            opened("/sys/kernel/minidp-run")


def test_run_json_records_the_start_and_every_resume(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    config = {"model": "mlp", "epochs": 2}
    run_json.write_run_json(str(tmp_path), RUN_ID, config, WORLD, 1)
    first = json.loads((tmp_path / "run.json").read_text())
    assert first["config"] == config and first["world_size"] == 1
    assert first["ranks_per_node"] == 1 and first["slurm_job_id"] == "4242"
    assert first["hosts"] == [HOST]
    assert first["mpi_library"] and "\x00" not in first["mpi_library"]
    assert first["start_time"].endswith("+00:00")
    assert first["git_commit"] is None or len(first["git_commit"]) == 40
    held = first[claim.MARKER]
    assert (held["pid"], held["run_id"], held["host"], held["ended"]) == (os.getpid(), RUN_ID,
                                                                          HOST, None)
    assert held["start_ticks"] == claim.process_start(os.getpid())[0]
    run_json.write_run_json(str(tmp_path), RUN_ID, dict(config, epochs=4), WORLD, 1,
                            resumed_from=2)
    run_json.write_run_json(str(tmp_path), RUN_ID, dict(config, epochs=4, lr=0.01), WORLD, 1,
                            resumed_from=3)
    again = json.loads((tmp_path / "run.json").read_text())
    assert again["start_time"] == first["start_time"] and again["config"] == config
    assert again[claim.MARKER] == first[claim.MARKER]
    assert [(r["from_epoch"], r["config"]["epochs"], r["changed"]) for r in again["resumed"]] \
        == [(2, 4, {"epochs": [2, 4]}), (3, 4, {"lr": [None, 0.01]})]
    assert [n for n in os.listdir(tmp_path) if "tmp" in n] == []
    run_json.release(str(tmp_path), RUN_ID)
    assert json.loads((tmp_path / "run.json").read_text())[claim.MARKER]["ended"]


def test_git_commit_is_none_outside_a_work_tree(tmp_path):
    assert run_json.git_commit(str(tmp_path)) is None


def test_a_run_directory_removed_mid_run_is_one_error_naming_the_file(tmp_path):
    import shutil

    out = tmp_path / "run"
    run = opened(out)
    files = RunFiles(str(out), 0, WORLD, run.run_id)
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


def test_a_link_or_fifo_among_the_outputs_is_refused_not_written_through(tmp_path):
    out, outside = tmp_path / "run", tmp_path / "outside.txt"
    run = opened(out)
    outside.write_text("theirs")
    files = RunFiles(str(out), 0, WORLD, run.run_id)
    files.start_metrics([])
    os.remove(out / "metrics.jsonl")
    os.symlink(outside, out / "metrics.jsonl")  # planted while the run trains
    with pytest.raises(OSError, match=rf"rank 0: '{out}/metrics.jsonl' is a symbolic link, not "
                                      "a regular file that minidp wrote"):
        files.append_metrics({"epoch": 1})
    os.mkfifo(out / f"summary.json.tmp-{run.run_id}")  # a reader would block on it
    with pytest.raises(OSError, match=rf"'{out}/summary.json.tmp-{run.run_id}' is a FIFO"):
        files.write_results({"w": np.zeros(2)}, {})
    assert outside.read_text() == "theirs"
    with Directory.open(str(out)) as directory:
        problems = owned.survey(directory, run.run_id).problems
    assert problems == [
        f"'{out}/metrics.jsonl' is a symbolic link, not a regular file that minidp wrote",
        f"'{out}/summary.json.tmp-{run.run_id}' is a FIFO (named pipe), not a regular file that "
        "minidp wrote"]
