"""Two real hosts on this machine (tests/hosts.py): every hierarchical path across a real link.

The same jobs run as 2 hosts x 2 ranks (MPI's own nodes: a shared-memory window per host,
the rails over TCP through a veth link) and as 2 virtual nodes of 2 on one host
(``--ranks-per-node 2``). In float64 every deterministic strategy must end with the same
bits on both; the bytes minidp counts between nodes must be what crossed the link; MPI-IO
must read right from both hosts; a checkpoint must move between the two layouts, bit for
bit; a rank killed or stopped on the second host must end the job and be named.

Needs root and ``ip netns`` (skipped with the reason otherwise). Runs under either
launcher: MPICH's Hydra (``-launcher ssh``) or Open MPI's ``mpirun`` (``--mca
plm_rsh_agent``), through the same namespaces (tests/hosts.py). docs/reliability.md,
"Two real hosts on one machine", has the figures these tests print (``pytest -rP``).
"""

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from hosts import Hosts, available
from hosts_cli import host_cpus
from hosts_names import cleanup_stale
from spmd import ROOT, WATCHDOG_FIRED, Launch, job_status, launcher

from minidp.reporting.launcher import mpiexec
from minidp.simulate.command import add_arguments
from minidp.simulate.predict import setup
from minidp.simulate.validate import compare

OK, WHY = available()
# `make test` runs the module on one pytest-xdist worker: its fixtures are shared.
pytestmark = [pytest.mark.skipif(not OK, reason=f"no real hosts here: {WHY}"),
              pytest.mark.xdist_group("hosts")]

JOB = os.path.join(ROOT, "tests", "scripts", "hosts_job.py")
EPOCHS = 2
DASO = {"warmup_epochs": 1, "cooldown_epochs": 0}  # epoch 2 cycles
CASES = {
    **{f"sync-{a}": {"strategy": "sync", "allreduce": a} for a in (
        "mpi", "ring", "hierarchical", "hierarchical_leader")},
    "hsgd": {"strategy": "hsgd"},
    "hsgd-parameters": {"strategy": "hsgd", "options": {
        "average": "parameters", "level1_period": 2, "level2_period": 4}},
    "hbsgd": {"strategy": "hbsgd"},
    "daso": {"strategy": "daso", "options": DASO},
    "daso-rail": {"strategy": "daso", "options": dict(DASO, global_sync="rail")},
    "easgd-sync": {"strategy": "easgd-sync"},
    "asgd": {"strategy": "asgd", "options": {"order": "round_robin"}},
    "easgd-async": {"strategy": "easgd-async", "options": {"order": "round_robin"}},
    "hogwild": {"strategy": "hogwild"},
}
# Ranks of one node race on its shared parameters: any arrival order is right.
RACING = {"hogwild"}
# Their evaluated and saved model is the centre, broadcast from rank 0 after each epoch and
# at the end, outside the training bytes minidp counts. (easgd-sync's ranks each keep the
# centre: nothing to broadcast.)
CENTRE_BROADCASTS = {"asgd", "easgd-async"}
# How often one broadcast (Ibcast from rank 0) of 0, 1 | 2, 3 crosses the link: MPICH's
# binomial tree once; Open MPI's (libnbc) twice, rank 0 sending to each rank of host 2
# (measured alone with tests/hosts.py: 5 Ibcasts of 4.3 MB, 42.9 MB across, MPICH 21.5 MB).
CENTRE_CROSSINGS = {"mpich": 1, "openmpi": 2}
STOPPED_TIMEOUT = 5  # --comm-timeout of the fault jobs
# A hang guard for the jobs of many runs: the hosts' job took 78 s under MPICH and 150 to
# 180 s under Open MPI on this 2-core machine at a load of 20 (mpirun keeps its ranks in
# its own session, which Linux's autogroup scheduler gives one share of a busy machine;
# Hydra gives each rank a session, and a share, of its own: docs/reliability.md).
JOB_TIMEOUT_S = 300


def launch(args, hosts=None, timeout=150, on_out=None):
    """``mpiexec [hosts' placement | -n 4] python -m mpi4py ARGS`` in its own session.

    ``on_out(line)`` is called from a reader thread when a line starting ``out: `` arrives
    (training has started on every rank).
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1", MPIEXEC_TIMEOUT=str(timeout - 20),
               MINIDP_SPMD="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    place = hosts.mpiexec_args(2, env=env) if hosts else ["-n", "4"]
    start = time.monotonic()
    proc = subprocess.Popen([mpiexec(), *place, sys.executable, "-m", "mpi4py", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []

    def read():
        for line in proc.stdout:
            lines.append(line)
            if on_out and line.startswith("out: "):
                on_out(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.wait(timeout)
        killed = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        killed = True
    reader.join(10)
    output = "".join(lines)
    return Launch(None if killed else job_status(proc.returncode, output), output,
                  time.monotonic() - start, killed)


def job(plan, path, hosts=None):
    """Run tests/scripts/hosts_job.py with ``plan``; fail the test with its output if it fails."""
    with open(path, "w") as f:
        json.dump(plan, f)
    done = launch([JOB, str(path)], hosts, timeout=JOB_TIMEOUT_S)
    assert done.returncode == 0, done.output[-6000:]
    return done


def model(out):
    with np.load(os.path.join(out, "model.npz")) as f:
        return {k: f[k] for k in f.files}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, synthetic_data_dir):
    """Every case on 2 virtual nodes of 2, then on 2 hosts x 2; checkpoints in between.

    The virtual job also writes a DASO checkpoint after epoch 1 (``y``) that the hosts'
    job continues; the hosts' job writes one (``x``) for test_checkpoints_move_... .
    The hosts' job also reports ``minidp info``, tries virtual nodes of 4 across the
    hosts, and runs tests/mpi/test_readers.py (MPI-IO and the leader reader) on its ranks,
    without colours (Open MPI gives each rank a terminal as stdout, and pytest would colour
    the summary line that test_mpiio_and_the_leader_reader_... reads).
    """
    cleanup_stale()  # what killed runs left behind (dead owners only)
    tmp = tmp_path_factory.mktemp("hosts")
    half = dict(CASES["daso"], checkpoint_every=1, stop_after=1)
    virtual = {"data_dir": synthetic_data_dir, "ranks_per_node": 2,
               "runs": [dict(c, out=str(tmp / "virtual" / k)) for k, c in CASES.items()]
               + [dict(half, out=str(tmp / "y"))]}
    job(virtual, tmp / "virtual.json")
    (tmp / "info").mkdir()
    real = {"data_dir": synthetic_data_dir, "ranks_per_node": None, "links": True,
            "info": str(tmp / "info"), "pytest": ["--color=no", "tests/mpi/test_readers.py"],
            "runs": [dict(c, out=str(tmp / "hosts" / k)) for k, c in CASES.items()]
            + [dict(CASES["daso"], checkpoint_every=1, resume="yes", out=str(tmp / "y")),
               dict(half, out=str(tmp / "x")),
               dict(CASES["hsgd"], ranks_per_node=4, out=str(tmp / "across"))]}
    with Hosts(2) as hosts:
        done = job(real, tmp / "real.json", hosts)
    assert not hosts.leftovers
    return {"tmp": tmp, "names": hosts.names, "output": done.output,
            "data_dir": synthetic_data_dir}


@pytest.mark.parametrize("case", sorted(set(CASES) - RACING))
def test_a_deterministic_strategy_ends_with_the_same_bits_on_real_hosts(runs, case):
    real, virtual = runs["tmp"] / "hosts" / case, runs["tmp"] / "virtual" / case
    a, b = model(real), model(virtual)
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=f"{case}: {key}")
    summaries = [json.loads((d / "summary.json").read_text()) for d in (real, virtual)]
    assert summaries[0]["topology"] == summaries[1]["topology"]
    assert summaries[0]["bytes_sent"] == summaries[1]["bytes_sent"]
    assert summaries[0]["final"] == summaries[1]["final"]


def test_a_racing_strategy_trains_on_real_hosts(runs):
    summary = json.loads((runs["tmp"] / "hosts" / "hogwild" / "summary.json").read_text())
    first, last = summary["epochs"][0], summary["epochs"][-1]
    assert [e["epoch"] for e in summary["epochs"]] == list(range(1, EPOCHS + 1))
    assert np.isfinite(last["train_loss"]) and last["train_loss"] < first["train_loss"]
    assert summary["topology"]["num_nodes"] == 2


# A flat allreduce over ranks 0, 1 | 2, 3 is counted whole as inter-node, by the traffic
# of its algorithm (docs/simulate.md's emulated rule), though part of it stays in a host:
FLAT_SHARE_ACROSS = {
    # counted as a ring, 2 x 3/4 n per rank. MPI's own in-place Iallreduce: MPICH runs
    # Rabenseifner, whose first halving round stays in the host (n/4 across in the
    # reduce-scatter and n/4 back, per rank); Open MPI's (libnbc) sends half across at this
    # size, unevenly (host 1 twice what host 2 sends), measured alone with tests/hosts.py
    "sync-mpi": {"mpich": 1 / 3, "openmpi": 1 / 2},
    # the ring 0 -> 1 -> 2 -> 3 -> 0: only the sends of ranks 1 and 3 leave their host
    "sync-ring": {"mpich": 1 / 2, "openmpi": 1 / 2},
}


def wire_bytes(case, counted, n):
    """What should cross the link for ``counted`` inter-node bytes of ``case``, model of n B."""
    share = FLAT_SHARE_ACROSS[case][launcher()] if case in FLAT_SHARE_ACROSS else 1
    broadcasts = (EPOCHS + 1) * CENTRE_CROSSINGS[launcher()] * (case in CENTRE_BROADCASTS)
    return counted * share + broadcasts * n


def test_the_link_carries_the_bytes_minidp_counts_between_nodes(runs):
    rows = []
    for case in CASES:
        out = runs["tmp"] / "hosts" / case
        # MPI's own allreduce over ranks of mixed nodes is counted apart ("mpi": its
        # algorithm decides what crosses); FLAT_SHARE_ACROSS says how much of it does.
        sent_bytes = json.loads((out / "summary.json").read_text())["bytes_sent"]
        counted = sent_bytes["inter"] + sent_bytes["mpi"]
        sent = json.loads((out / "links.json").read_text())["sent"]
        n = sum(a.nbytes for a in model(out).values())
        expected, crossed = wire_bytes(case, counted, n), sum(sent.values())
        rows.append(f"{case}: counted {counted:,}, expected on the wire {expected:,.0f}, "
                    f"crossed {crossed:,} ({crossed / expected - 1:+.2%})")
        # TCP/IP headers and the run's own small collectives (evaluation sums, run.json)
        assert expected <= crossed <= expected * 1.03 + 2 ** 20, rows[-1]
    print("\n".join(rows))


def test_run_json_and_info_report_the_real_hosts(runs):
    h0, h1 = runs["names"]
    machines = [{"host": h0, "ranks": [0, 1]}, {"host": h1, "ranks": [2, 3]}]
    record = json.loads((runs["tmp"] / "hosts" / "hsgd" / "run.json").read_text())
    assert record["hosts"] == [h0, h0, h1, h1] and record["machines"] == machines
    assert record["nodes"] == "machines" and record["ranks_per_node"] == 2
    virtual = json.loads((runs["tmp"] / "virtual" / "hsgd" / "run.json").read_text())
    assert virtual["nodes"] == "virtual" and len(virtual["machines"]) == 1
    for rank in range(4):
        info = json.loads((runs["tmp"] / "info" / f"info-{rank}.json").read_text())
        assert info["host"] == (h0 if rank < 2 else h1) and info["mpi_rank"] == rank
        assert info["machines"] == machines and info["threads"]["local_ranks"] == 2


def test_virtual_nodes_across_hosts_are_refused_naming_them(runs):
    h0, h1 = runs["names"]
    for rank in range(4):
        message = (runs["tmp"] / "across" / f"error-{rank}.txt").read_text()
        assert message == (f"rank {rank}: --ranks-per-node 4: virtual node 0 (ranks 0-3) spans "
                           f"machines (ranks 0-1 on {h0}; ranks 2-3 on {h1}), but a node's "
                           "ranks share memory; allowed here: 1, 2, or none to take MPI's "
                           "nodes")


def test_mpiio_and_the_leader_reader_read_right_on_both_hosts(runs):
    # the job's status is the worst rank's pytest status: 0 here
    assert re.search(r"\n\d+ passed in ", runs["output"]), runs["output"][-3000:]
    assert " failed" not in runs["output"], runs["output"][-3000:]


def test_checkpoints_move_between_real_and_virtual_nodes_bit_for_bit(runs):
    tmp = runs["tmp"]
    resume = dict(CASES["daso"], checkpoint_every=1, resume="yes", out=str(tmp / "x"))
    job({"data_dir": runs["data_dir"], "ranks_per_node": 2, "runs": [resume]},
        tmp / "resume-x.json")
    whole = model(tmp / "virtual" / "daso")
    for out in ("y", "x"):  # one host -> 2 hosts, and 2 hosts -> one host
        moved = model(tmp / out)
        for key in whole:
            np.testing.assert_array_equal(moved[key], whole[key], err_msg=f"{out}: {key}")
        record = json.loads((tmp / out / "run.json").read_text())
        assert [r["from_epoch"] for r in record["resumed"]] == [1]
        layouts = [record["nodes"], record["resumed"][0]["nodes"]]
        assert layouts == (["virtual", "machines"] if out == "y" else ["machines", "virtual"])


@pytest.fixture
def hosts():
    cleanup_stale()
    with Hosts(2) as made:
        yield made
    assert not made.leftovers


def train_args(out, data_dir, *extra):
    return ["-m", "minidp", "train", "--dataset", "synthetic", "--model", "mlp",
            "--data-dir", data_dir, "--train-samples", "800", "--test-samples", "64",
            "--batch-size", "16", "--epochs", "2", "--no-progress", "--strategy", "hsgd",
            "--comm-timeout", str(STOPPED_TIMEOUT), "--out", str(out), *extra]


def test_a_rank_killed_on_host_2_ends_the_job_and_is_named(hosts, tmp_path, synthetic_data_dir):
    pids = {}
    done = launch(train_args(tmp_path / "run", synthetic_data_dir, "--inject-fault",
                             "3:2:kill"), hosts, on_out=lambda _: pids.update(
                                 hosts.rank_pids(1)))
    assert not done.killed and done.returncode not in (0, None), done.output
    if launcher() == "mpich":  # Hydra names the process by pid and host, as on one host
        named = f"PID {pids[3]} RUNNING AT {hosts.names[1]}"
        assert "EXIT CODE: 9" in done.output, done.output
    else:  # mpirun names the rank, its pid and its host
        named = (f"process rank 3 with PID {pids[3]} on node {hosts.names[1]} exited on "
                 "signal 9 (Killed)")
    assert named in done.output, done.output
    print(f"killed rank 3 on {hosts.names[1]}: job ended in {done.seconds:.1f} s, "
          f"exit {done.returncode}; {named}")


def test_a_rank_stopped_on_host_2_ends_the_job_and_is_named(hosts, tmp_path,
                                                            synthetic_data_dir):
    stopped = {}

    def stop(_):
        stopped["pid"] = hosts.rank_pids(1)[3]
        os.kill(stopped["pid"], signal.SIGSTOP)
        stopped["at"] = time.monotonic()

    done = launch(train_args(tmp_path / "run", synthetic_data_dir), hosts, on_out=stop)
    after = time.monotonic() - stopped["at"]
    assert not done.killed and done.returncode not in (0, None), done.output
    assert WATCHDOG_FIRED not in done.output, done.output
    # rank 2 shares the host: it sees rank 3's record and its process, stopped
    named = re.search(rf"rank 2: .*\(MINIDP_COMM_TIMEOUT\).*rank 3: process {stopped['pid']} "
                      r"stopped \([^)]*\)", done.output)
    assert named, done.output
    print(f"stopped rank 3 on {hosts.names[1]}: job ended {after:.1f} s later, "
          f"exit {done.returncode}; {named.group(0)}")


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores: one per host")
def test_simulate_validates_against_the_two_host_job(synthetic_data_dir):
    """``simulate --validate --real-nodes``: each host on a core of its own, as virtual
    nodes are bound in tests/test_simulate.py; docs/reliability.md has both figures."""
    with Hosts(2, cpus=host_cpus(2, 1)) as made:
        args = add_arguments(argparse.ArgumentParser()).parse_args([
            "--nodes", "2", "--ranks-per-node", "2", "--strategy", "hsgd", "--model", "mlp",
            "--dataset", "synthetic", "--samples", "2048", "--epochs", "2",
            "--net-latency-us", "50", "--net-bandwidth-gbps", "1", "--validate",
            "--real-nodes", "--mpiexec-args", shlex.join(made.mpiexec_args(2, count=False)),
            "--data-dir", synthetic_data_dir])
        [row] = compare(args, setup(args))
    h0, h1 = made.names
    assert row.command.endswith(f"# on {h0} (ranks 0-1), {h1} (ranks 2-3)"), row.command
    # no virtual nodes, and none of the core lists simulate gives Hydra for them
    assert "--ranks-per-node" not in row.command and "-bind-to user:" not in row.command
    assert row.epochs == [2] and 0 < row.measured_comm_share < 1
    print(f"hsgd on 2 hosts: predicted {row.predicted.seconds:.2f} s, measured "
          f"{row.measured_s:.2f} s ({row.error:+.0%})")
