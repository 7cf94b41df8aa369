"""``minidp train`` and its run directory, as a hostile user finds it (issue 40).

One live job per directory; links planted in a run never followed; an unwritable ``--out``
named; what the messages of a diverged or resumed run tell to do, done. Every job is one
rank without mpiexec (:func:`test_train_cli.train_here`): what is tested is the run
directory, not the launcher.
"""

import json
import os
import signal
import time

from test_train_cli import HANG_S, epochs_in, start_here, train_here


def wait_for(condition, job, what):
    """Poll ``condition`` while ``job`` runs; a hang guard, never a bound the test asserts."""
    deadline = time.monotonic() + HANG_S
    while not condition():
        assert job.poll() is None, f"the job ended before {what}"
        assert time.monotonic() < deadline, f"no {what} after {HANG_S} s"
        time.sleep(0.2)


def test_a_live_jobs_directory_is_refused_naming_that_job_until_it_ends(tmp_path,
                                                                        synthetic_data_dir):
    """Issue 40: --overwrite aimed at a live run let both jobs write into it; a refused job
    was told to use --overwrite."""
    from spmd import finish_job

    out, data = str(tmp_path / "run"), synthetic_data_dir
    job = start_here(["--epochs", "10000", "--train-samples", "64", "--checkpoint-every", "1",
                      "--out", out], str(tmp_path), data)
    try:
        wait_for(lambda: os.path.exists(os.path.join(out, "checkpoints")), job, "checkpoint")
        holder = json.load(open(os.path.join(out, "run.json")))["minidp_run"]
        assert holder["pid"] == job.pid
        for flags in (["--overwrite"], ["--resume", "auto"], ["--resume"]):
            status, output = train_here(["--epochs", "3", "--out", out, *flags], str(tmp_path),
                                        data)
            assert status == 2, output
            assert output.strip().splitlines()[-1] == (
                f"error: --out '{out}' is in use by a running job: pid {job.pid} on host "
                f"{holder['host']} (started {holder['started']}), from its run.json; one job "
                "writes a run directory at a time: wait for that job to end, or choose another "
                "--out"), output
        assert epochs_in(out)[0] == 1  # the running job's rows only, from its first epoch
    finally:
        os.killpg(job.pid, signal.SIGTERM)  # a scheduler's warning: it stops, checkpointed
        output, killed = finish_job(job, HANG_S)
    assert not killed and job.returncode == 3, output
    assert json.load(open(os.path.join(out, "run.json")))["minidp_run"]["ended"]  # released
    status, output = train_here(["--epochs", "1", "--overwrite", "--out", out], str(tmp_path),
                                data)
    assert status == 0 and "note:" not in output, output  # taken over without a word
    assert epochs_in(out) == [1]


def test_a_link_planted_in_the_run_is_never_followed(tmp_path, synthetic_data_dir):
    """Issue 40: a link planted in the run directory was followed: the resume read the
    checkpoints it pointed at and wrote its own there."""
    out, outside = tmp_path / "run", tmp_path / "elsewhere"
    job = ["--epochs", "3", "--train-samples", "64", "--checkpoint-every", "1", "--out",
           str(out)]
    status, output = train_here(job + ["--stop-after", "1"], str(tmp_path), synthetic_data_dir)
    assert status == 0, output
    os.rename(out / "checkpoints", outside)
    os.symlink(outside, out / "checkpoints")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in outside.rglob("*"))
    status, output = train_here(job + ["--resume"], str(tmp_path), synthetic_data_dir)
    assert status == 2 and "Traceback" not in output, output
    assert output.strip().splitlines()[-1] == (
        f"error: --out '{out}': '{out}/checkpoints' is a symbolic link, not a directory that "
        "minidp wrote; minidp never follows, replaces or removes what it did not write: move it "
        "away, or choose another directory")
    assert sorted((p.name, p.stat().st_mtime_ns) for p in outside.rglob("*")) == before


def test_an_unwritable_out_is_one_line_naming_it_and_what_to_do(tmp_path, synthetic_data_dir):
    """Issue 40: an unwritable --out printed a raw errno."""
    (tmp_path / "a-file").write_text("not a directory")
    out = str(tmp_path / "a-file" / "run")
    status, output = train_here(["--epochs", "1", "--out", out], str(tmp_path),
                                synthetic_data_dir)
    assert status == 2 and "Traceback" not in output, output
    assert output.strip().splitlines()[-1] == (
        f"error: --out '{out}': cannot create or write the run directory ('{out}': Not a "
        "directory (ENOTDIR)); a part of that path is a file, not a directory: choose another "
        "--out")


def test_a_diverged_run_without_a_checkpoint_is_told_how_to_start_over(tmp_path,
                                                                       synthetic_data_dir):
    """Issue 40: the divergence message told to resume from a checkpoint that did not exist."""
    out = str(tmp_path / "run")
    job = ["--epochs", "2", "--train-samples", "64", "--out", out]
    status, output = train_here(job + ["--inject-fault", "0:2:nan"], str(tmp_path),
                                synthetic_data_dir)
    assert status == 4 and "Traceback" not in output, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("error: the gradient of parameter '1.weight' is not finite "
                           "at step 2 of the run (epoch 1, batch 2); it was neither sent nor "
                           "applied; no checkpoint of this run was written (there is nothing to "
                           f"resume): start it over with a lower rate: --overwrite --out {out} "
                           "--lr "), output
    advice = last.split("--overwrite --out ")[1].split()
    status, output = train_here(job + ["--overwrite", "--out", *advice], str(tmp_path),
                                synthetic_data_dir)  # what the message says, done
    assert status == 0, output
    assert epochs_in(out) == [1, 2]


def test_a_resume_in_the_first_epoch_counts_epochs_from_1(tmp_path, synthetic_data_dir):
    """Issue 40: "resuming after epoch 0" where the console counts epochs from 1."""
    out = str(tmp_path / "run")
    job = ["--epochs", "2", "--train-samples", "64", "--out", out]
    status, output = train_here(job + ["--inject-fault", "0:2:sigterm"], str(tmp_path),
                                synthetic_data_dir)
    assert status == 3, output
    stopped = os.listdir(os.path.join(out, "checkpoints"))
    assert len(stopped) == 1 and stopped[0].startswith("epoch-0000-batch-"), stopped
    batch = int(stopped[0][-5:])
    status, output = train_here(job + ["--resume"], str(tmp_path), synthetic_data_dir)
    assert status == 0, output
    assert f"out: {out} (resuming in epoch 1, after batch {batch})\n" in output
    assert "epoch 1/2: train loss" in output and epochs_in(out) == [1, 2]
