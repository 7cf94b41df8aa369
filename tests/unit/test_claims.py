"""Claims: one live job per run directory (one process; other jobs are forked processes).

A job that runs holds its directory; one that has gone (killed, its pid reused by another
process, an earlier run of a requeued Slurm job) has it taken over with a note; one on a
host minidp cannot see holds it until it is seen to end. Two jobs that decide at once
are serialised by the claim's lock.
"""

import json
import os
import subprocess

import pytest
from test_checkpoints import save
from test_rundir import HOST, opened, released

from minidp.run import claim, run_json, rundir
from minidp.run.errors import UsageError


def open_at_once(out, resume, ready, decided, results):
    """A forked job's rank 0: wait for the start, open ``out``, report, and stay alive until
    every job has decided (a job that ended would rightly be taken over)."""
    from mpi4py import MPI

    ready.wait()
    try:
        run = rundir.open_run(out, resume, False, MPI.COMM_SELF)
        results.put((os.getpid(), "resumed" if run.resuming else "claimed"))
    except UsageError as exc:
        results.put((os.getpid(), str(exc)))
    decided.wait(120)


def race(out, resume, trials=20):
    """``trials`` pairs of jobs opening ``out`` at once: each pair's (winner, loser's message)."""
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    for _ in range(trials):
        ready, decided, results = fork.Event(), fork.Event(), fork.Queue()
        where = out()
        jobs = [fork.Process(target=open_at_once, args=(where, resume, ready, decided, results))
                for _ in "ab"]
        for job in jobs:
            job.start()
        ready.set()  # both at once
        outcomes = dict(results.get(timeout=120) for _ in jobs)
        decided.set()
        for job in jobs:
            job.join(60)
        winners = [pid for pid, what in outcomes.items() if what in ("claimed", "resumed")]
        assert len(winners) == 1, outcomes
        yield winners[0], next(what for pid, what in outcomes.items() if pid != winners[0])


def holder_of(out):
    return run_json.read_run_json(str(out))[claim.MARKER]


def test_two_jobs_started_together_on_one_out_one_claims_it_20_times(tmp_path):
    count = iter(range(20))
    path = lambda: str(tmp_path / f"race-{next(count)}")  # noqa: E731 (a new one per pair)
    for trial, (winner, loser) in enumerate(race(path, "no")):
        out = tmp_path / f"race-{trial}"
        held = holder_of(out)
        assert held["pid"] == winner
        assert loser == (f"--out '{out}' is in use by a running job: {claim.describe(held)}, "
                         "from its run.json; one job writes a run directory at a time: wait for "
                         "that job to end, or choose another --out"), loser


def test_two_resume_auto_jobs_on_one_checkpoint_one_resumes_20_times(tmp_path):
    """Issue 40: both resumed from the same checkpoint and both exited 0."""
    out = tmp_path / "run"
    first = released(out)
    save(out, first.run_id, 1)
    for winner, loser in race(lambda: str(out), "auto"):
        held = holder_of(out)
        assert held["pid"] == winner and held["run_id"] == first.run_id  # the run goes on
        assert loser.startswith(f"--out '{out}' is in use by a running job: pid {winner} "), loser
        assert "--overwrite" not in loser
        record = run_json.read_run_json(str(out))  # released, as the winner does when it ends
        record[claim.MARKER]["ended"] = "2026-01-01T00:00:00+00:00"
        (out / "run.json").write_text(json.dumps(record))


def process_claim(pid, **changes):
    """A claim of the live process ``pid`` on this host, as that job would have made it."""
    start, _ = claim.process_start(pid)
    return dict(claim.new_claim(), pid=pid, start_ticks=start, started="then", **changes)


def with_claim(out, holder):
    record = run_json.read_run_json(str(out))
    record[claim.MARKER] = dict(holder, run_id=record[claim.MARKER]["run_id"])
    (out / "run.json").write_text(json.dumps(record))


def test_a_live_jobs_directory_is_refused_naming_it_and_a_gone_ones_taken_over(tmp_path,
                                                                               capsys):
    """Issue 40: --overwrite aimed at a live run let both jobs write into it, and a resumed
    live run was resumed again; a claim whose job is gone is taken over, saying so."""
    out = tmp_path / "run"
    run = released(out)
    save(out, run.run_id, 1)
    job = subprocess.Popen(["sleep", "600"])
    try:
        with_claim(out, process_claim(job.pid))
        before = sorted(str(p) for p in out.rglob("*"))
        for resume, overwrite in (("no", True), ("auto", False), ("yes", False), ("no", False)):
            with pytest.raises(UsageError) as info:
                opened(out, resume, overwrite)
            assert str(info.value) == (
                f"--out '{out}' is in use by a running job: pid {job.pid} on host {HOST} "
                "(started then), from its run.json; one job writes a run directory at a time: "
                "wait for that job to end, or choose another --out")
        assert sorted(str(p) for p in out.rglob("*")) == before  # nothing touched
        # the same pid, started at another time: another process (a reused pid)
        with_claim(out, dict(process_claim(job.pid), start_ticks=1))
        assert opened(out, "auto").resuming
        assert "note: --out '" + str(out) + f"' was held by pid {job.pid} on host {HOST} " \
            "(started then), which is no longer running (it ended without releasing it: " \
            "killed?); this job takes it over" in capsys.readouterr().out
    finally:
        job.kill()
        job.wait()
    with_claim(out, dict(process_claim(os.getpid()), pid=job.pid))  # that pid now: nobody's
    assert opened(out, "no", True).resuming is False
    assert "which is no longer running" in capsys.readouterr().out
    with_claim(out, dict(claim.new_claim(), host="elsewhere", boot_id="x"))
    with pytest.raises(UsageError, match=rf"--out '{out}' is held by pid \d+ on host elsewhere "
                                         r"\(started .*\), which minidp cannot see from host "
                                         f"{HOST}, and its claim was never released, so it may "
                                         "still run: if it has ended, run this on host "
                                         "elsewhere"):
        opened(out, "no", True)


def test_a_run_id_is_never_a_path(tmp_path):
    """The run's id goes into file names: a hand-made one with a '/' would lead out."""
    out = tmp_path / "run"
    released(out)
    record = run_json.read_run_json(str(out))
    record[claim.MARKER]["run_id"] = "../../outside"
    (out / "run.json").write_text(json.dumps(record))
    with pytest.raises(UsageError, match=r"no run of minidp's \('.*run.json': its 'minidp_run' "
                                         r"entry has no valid run_id \(16 hexadecimal digits\)"):
        opened(out, "no", True)
    assert os.listdir(tmp_path) == ["run"]


def test_a_requeued_slurm_job_takes_over_its_earlier_run(tmp_path, monkeypatch):
    out = tmp_path / "run"
    released(out)
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    earlier = dict(claim.new_claim(), host="node9", boot_id="x",
                   slurm={"job_id": "77", "restart_count": "0"})
    with_claim(out, earlier)
    assert opened(out, "no", True).resuming is False
    with_claim(out, dict(earlier, slurm={"job_id": "78", "restart_count": "0"}))
    with pytest.raises(UsageError, match="held by pid .* on host node9"):
        opened(out, "no", True)


def test_a_lock_left_by_a_killed_job_is_named_not_removed(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    job = subprocess.Popen(["true"])
    job.wait()
    (out / claim.LOCK).write_text(json.dumps(dict(claim.this_process(), pid=job.pid)))
    with pytest.raises(UsageError, match=rf"'{out}/run.json.lock' was left by pid {job.pid} on "
                                         rf"host {HOST} .* is no longer running; if no job is "
                                         rf"starting in '{out}', remove that file and run again"):
        opened(out)
    assert os.listdir(out) == [claim.LOCK]
