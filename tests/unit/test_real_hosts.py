"""What the real-hosts work added that one process can check, as any user.

The node layout that a checkpoint records and compares; ``simulate --validate
--real-nodes`` refusing a run that did not come out P x G; the hosts fixture's refusals
(tests/hosts.py), its per-host CPUs and what it says where it cannot work.
"""

import dataclasses
import json
import os
from pathlib import Path

import hosts
import hosts_cli
import pytest
from hosts_names import COUNTERS_ENV
from mpi4py import MPI

from minidp.comm.topology import machines
from minidp.run import checkpoint
from minidp.run.config import TrainConfig
from minidp.run.errors import UsageError
from minidp.simulate.validate import check_nodes


def layout_checkpoint(nodes, ranks_per_node):
    saved = dataclasses.asdict(TrainConfig(strategy="hsgd", epochs=4, batch_size=16,
                                           ranks_per_node=ranks_per_node))
    return {"epoch": 2, "world_size": 4, "nodes": nodes, "config": saved}


@pytest.mark.parametrize("saved_rpn, now_rpn", [(None, 2), (2, None), (2, 2)])
def test_the_same_layout_resumes_whatever_ranks_per_node_says(saved_rpn, now_rpn):
    # 2 hosts of 2 ranks (no --ranks-per-node) and 2 virtual nodes of 2: one layout
    meta = layout_checkpoint([0, 0, 1, 1], saved_rpn)
    now = dict(meta["config"], ranks_per_node=now_rpn)
    checkpoint.check_resumable(meta, now, 4, "ck", nodes=[0, 0, 1, 1])


def test_another_layout_is_refused_with_both():
    meta = layout_checkpoint([0, 0, 1, 1], None)
    now = dict(meta["config"], ranks_per_node=1)
    with pytest.raises(UsageError) as info:
        checkpoint.check_resumable(meta, now, 4, "ck", nodes=[0, 1, 2, 3])
    assert str(info.value) == ("--resume: cannot continue checkpoint 'ck': nodes (the node of "
                               "each rank): checkpoint [0, 0, 1, 1], now [0, 1, 2, 3]")


def test_a_checkpoint_without_a_layout_compares_the_flag():
    meta = layout_checkpoint(None, None)
    del meta["nodes"]
    with pytest.raises(UsageError, match=r"--ranks-per-node: checkpoint None, now 2"):
        checkpoint.check_resumable(meta, dict(meta["config"], ranks_per_node=2), 4, "ck",
                                   nodes=[0, 0, 1, 1])


def test_machines_of_one_process_is_this_host():
    assert machines(MPI.COMM_SELF) == [{"host": MPI.Get_processor_name(), "ranks": [0]}]


def run_json(tmp_path, groups):
    (tmp_path / "run.json").write_text(json.dumps({"machines": [
        {"host": f"h{i}", "ranks": ranks} for i, ranks in enumerate(groups)]}))
    return str(tmp_path)


def test_validation_on_real_nodes_refuses_a_run_that_is_not_p_by_g(tmp_path):
    assert check_nodes(run_json(tmp_path, [[0, 1], [2, 3]]), 2, 2) == \
        "h0 (ranks 0-1), h1 (ranks 2-3)"
    with pytest.raises(ValueError, match=r"--real-nodes: the run's nodes were h0 \(ranks 0-3\); "
                                         r"allowed: 2 nodes of 2 ranks, as simulated"):
        check_nodes(run_json(tmp_path, [[0, 1, 2, 3]]), 2, 2)


def test_hosts_say_why_they_cannot_be_made(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert hosts.available() == (False, "needs root (CAP_NET_ADMIN for links, CAP_SYS_ADMIN "
                                        "for namespaces)")
    with pytest.raises(ValueError, match=r"n_hosts: got 65, allowed: 1 to 64"):
        hosts.Hosts(65)
    with pytest.raises(ValueError, match=r"name_prefix: got 'a-b', allowed: letters and digits"):
        hosts.Hosts(2, name_prefix="a-b")
    with pytest.raises(ValueError, match=r"cpus: got \[\[0\]\], allowed: 2 non-empty lists"):
        hosts.Hosts(2, cpus=[[0]])


def test_each_host_gets_its_own_block_of_cpus(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 5})
    assert hosts_cli.host_cpus(2, 2) == [[0, 1], [2, 3]]
    assert hosts_cli.host_cpus(2, None) is None
    with pytest.raises(ValueError, match=r"--cores-per-host: got 3, allowed: 1 to 2 \(5 CPUs "
                                         r"here for 2 hosts\)"):
        hosts_cli.host_cpus(2, 3)


def test_open_mpis_placement_names_the_agent_the_links_the_hosts_and_every_variable():
    """What mpirun is given for the hosts (tests/test_hosts.py runs it, as root only)."""
    made = hosts.Hosts(2, name_prefix="mhu")
    made.wrapper, made.workdir = Path("/w/ssh-wrapper.sh"), Path("/w")
    args = made._mpirun_args(2, True, {"B": "2", "A": "1", COUNTERS_ENV: "old"})

    def after(flag, *values):
        at = [i for i in range(len(args)) if args[i:i + 1 + len(values)] == [flag, *values]]
        return bool(at)

    assert after("--mca", "plm_rsh_agent", "/w/ssh-wrapper.sh")
    assert after("--mca", "oob_tcp_if_include", "mhubr")
    assert after("--mca", "btl_tcp_if_include", "mhubr")
    # Open MPI passes the ranks only the variables named: each of the job's, once
    assert [args[i + 1] for i in range(len(args)) if args[i] == "-x"] == [
        "A", "B", f"{COUNTERS_ENV}=/w/counters.sock"]
    assert args[-4:] == ["--host", "mhuh0:2,mhuh1:2", "-n", "4"]
    assert made._mpirun_args(2, False, {})[-2:] == ["--host", "mhuh0:2,mhuh1:2"]
