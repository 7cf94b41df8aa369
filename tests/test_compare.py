"""`minidp compare`: flags checked before any launch, options routed, one job per strategy."""

import json
import os
import subprocess
import sys
import threading
import time

import pytest
from spmd import ROOT

from minidp.__main__ import main
from minidp.reporting import compare, launcher

pytest.importorskip("matplotlib")


def test_a_set_option_goes_only_to_the_strategy_it_names():
    flags = ["--epochs", "2", "--set", "daso.warmup_epochs=1", "--set", "hsgd.lars=1",
             "--lr", "0.1"]
    assert compare.flags_for("daso", flags) == ["--epochs", "2", "--set",
                                                "daso.warmup_epochs=1", "--lr", "0.1"]
    assert compare.flags_for("sync", flags) == ["--epochs", "2", "--lr", "0.1"]


def test_bad_input_is_refused_before_any_job_starts():
    with pytest.raises(ValueError, match="--strategies: got 'snyc', allowed: sync"):
        compare.strategies_of("sync,snyc")
    with pytest.raises(ValueError, match="got 'daso:rail', allowed: daso:OPTION=VALUE"):
        compare.strategies_of("daso:rail")
    with pytest.raises(ValueError, match="--out is set by compare"):
        compare.check_train_flags([("sync", [])], ["--out", "x"])
    with pytest.raises(ValueError, match="--lr"):
        compare.check_train_flags([("sync", []), ("hsgd", [])], ["--lr", "-1"])
    with pytest.raises(ValueError, match="daso.global_sync: got 'ring', allowed: 'all' or"):
        compare.check_train_flags(compare.strategies_of("daso:global_sync=ring"), [])


def test_a_variant_is_a_strategy_with_its_own_options():
    variants = compare.strategies_of("sync, daso:global_sync=rail:downcast=bf16")
    assert variants == [("sync", []), ("daso", ["--set", "daso.global_sync=rail",
                                                "--set", "daso.downcast=bf16"])]
    assert compare.job_name(*variants[1]) == "daso-global_sync=rail-downcast=bf16"


def test_compare_trains_each_strategy_and_reports_them(tmp_path, synthetic_data_dir):
    out = tmp_path / "cmp"
    command = [sys.executable, "-m", "minidp", "compare", "--strategies",
               "sync,daso:global_sync=rail",
               "--ranks", "2", "--out", str(out), "--", "--model", "mlp",
               "--dataset", "synthetic", "--data-dir", synthetic_data_dir, "--epochs", "2",
               "--train-samples", "512", "--test-samples", "256", "--batch-size", "32",
               "--set", "daso.warmup_epochs=1", "--set", "daso.cooldown_epochs=0"]
    env = dict(os.environ, MPIEXEC_TIMEOUT="120", MINIDP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = sorted(os.listdir(out))
    assert runs[:2] == ["01-sync", "02-daso-global_sync=rail"]
    daso_config = json.load(open(out / "02-daso-global_sync=rail" / "run.json"))["config"]
    assert daso_config["options"]["warmup_epochs"] == 1
    assert daso_config["options"]["global_sync"] == "rail"
    text = (out / "report.md").read_text()
    assert "| sync |" in text
    assert "| daso (cooldown_epochs=0, global_sync=rail, warmup_epochs=1) |" in text
    assert (out / "accuracy.png").exists()


@pytest.mark.parametrize("option, message", [
    (["--timeout", "nan"], "compare: --timeout: got nan, allowed: a finite number of seconds > 0 "
                           "(each job's)"),
    (["--timeout", "-5"], "compare: --timeout: got -5.0, allowed: a finite number of seconds > 0 "
                          "(each job's)"),
    (["--timeout", "inf"], "compare: --timeout: got inf, allowed: a finite number of seconds > 0 "
                           "(each job's)"),
    (["--mpiexec", "/nowhere/mpiexec"], "compare: --mpiexec: got '/nowhere/mpiexec', allowed: a "
                                        "program that exists and may be run (a path, or a "
                                        "name on PATH)"),
    (["--out", "{file}"], "compare: --out: '{file}' is not a directory, allowed: a new or empty "
                          "directory"),
    (["--", "--epochs", "two"], "compare: train flags: argument --epochs: invalid int value: "
                                "'two' (see python -m minidp train --help)"),
], ids=["nan", "negative", "inf", "mpiexec", "out", "flags"])
def test_compares_own_bad_options_are_one_line_before_any_job(tmp_path, capsys, option,
                                                              message):
    taken = tmp_path / "taken"
    taken.write_text("a user's file\n")
    args = ["compare", "--strategies", "sync", "--out", str(tmp_path / "cmp"), *option]
    args = [a.replace("{file}", str(taken)) for a in args]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no job was started (it would print its command line)
    assert captured.err == f"error: {message.replace('{file}', str(taken))}\n"
    assert taken.read_text() == "a user's file\n"


def job_processes(marker):
    """The live processes whose command line holds ``marker`` (this test's own path)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def shm_job(tmp_path, *mode):
    listed = str(tmp_path / "shm.txt")
    command = [launcher.mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py",
               os.path.join(ROOT, "tests", "scripts", "shm_job.py"), listed, *mode]
    return command, listed


def run_until_ready(command, listed, timeout, grace_s):
    """run_job in a thread; its timeout counts only once both ranks hold their memory."""
    result = {}

    def job():
        result["status"], result["output"] = launcher.run_job(command, timeout,
                                                              grace_s=grace_s)

    thread = threading.Thread(target=job)
    thread.start()
    thread.join()
    ready = open(listed + ".ready").read().split() if os.path.exists(listed + ".ready") else []
    return result["status"], result["output"], ready


@pytest.mark.parametrize("mode, how", [((), "SIGTERM"),
                                        (("ignore-sigterm",), "SIGTERM, then SIGKILL after 3 s")],
                         ids=["sigterm", "sigkill"])
def test_a_job_past_its_timeout_is_ended_whole_and_leaves_no_shared_memory(tmp_path, mode,
                                                                           how, monkeypatch):
    if mode:
        # Open MPI's mpirun, sent SIGTERM, kills ranks that ignore it by itself after 2 s
        # (SIGCONT, SIGTERM and SIGKILL, odls_base_sigkill_timeout apart): give it longer,
        # so that the SIGKILL that ends the job is run_job's, as under MPICH.
        monkeypatch.setenv("OMPI_MCA_odls_base_sigkill_timeout", "30")
    timeout = 5.0
    for attempt in range(5):  # on a loaded machine the ranks may not have started within it
        os.mkdir(tmp_path / f"try{attempt}")
        command, listed = shm_job(tmp_path / f"try{attempt}", *mode)
        status, output, ready = run_until_ready(command, listed, timeout, grace_s=3)
        if sorted(ready) == ["0", "1"]:
            break
        timeout *= 2
    assert sorted(ready) == ["0", "1"], output
    assert status == launcher.TIMED_OUT, output
    assert output.endswith(f"(ended after {timeout:g} s, its timeout: {how})"), output
    mapped = set(open(listed).read().splitlines())
    assert mapped and all(p.startswith("/dev/shm/") for p in mapped), mapped
    assert [p for p in mapped if os.path.exists(p)] == []  # removed, not left for ever
    assert job_processes(listed) == []  # no rank outlived its launcher


def test_a_train_job_past_its_timeout_stops_at_sigterm_and_leaves_nothing(tmp_path,
                                                                          synthetic_data_dir):
    seen, done = set(), threading.Event()
    timeout = 8
    for attempt in range(5):  # on a loaded machine the job may still be starting within it
        out = str(tmp_path / f"run{attempt}")
        command = [launcher.mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m",
                   "minidp", "train", "--model", "mlp", "--dataset", "synthetic",
                   "--data-dir", synthetic_data_dir, "--epochs", "1000", "--batch-size", "8",
                   "--train-samples", "400", "--checkpoint-every", "1", "--no-progress",
                   "--out", out]

        def watch():  # the test's own record of the job's /dev/shm files, from /proc
            while not done.is_set():
                for pid in job_processes(out):
                    try:
                        with open(f"/proc/{pid}/maps") as f:
                            seen.update(line.split(None, 5)[-1].strip() for line in f
                                        if "/dev/shm/" in line)
                    except OSError:
                        pass
                time.sleep(0.2)

        done.clear()
        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            status, output = launcher.run_job(command, timeout, grace_s=120)
        finally:
            done.set()
            watcher.join()
        if "epoch 2/1000" in output:  # it trained before the SIGTERM came
            break
        timeout *= 2
    assert "epoch 2/1000" in output, output
    assert status == launcher.TIMED_OUT, output
    assert output.endswith(f"(ended after {timeout:g} s, its timeout: SIGTERM)"), output
    assert "Traceback" not in output and "MPI_Abort" not in output, output
    assert [p for p in seen if os.path.exists(p)] == []
    assert job_processes(out) == []
