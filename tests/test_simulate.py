"""``minidp simulate``: the cost formulas on hand-computed cases, the command line, one real run."""

import argparse
import dataclasses
import os

import pytest

from minidp.comm.network import NetworkModel, ring_traffic
from minidp.reporting import launcher
from minidp.simulate.command import add_arguments, main
from minidp.simulate.costs import (
    Cluster,
    Node,
    daso_epoch,
    hbsgd_epoch,
    hsgd_epoch,
    mpich_algorithm,
    rail_allreduce,
    sync_epoch,
    world_allreduce,
)
from minidp.simulate.measure import node_cores
from minidp.simulate.predict import parse_nodes, parse_strategies, setup
from minidp.simulate.validate import binding, compare

ALPHA, GBPS = 50e-6, 1.0  # 50 us, 1 Gbit/s
N = 2 ** 20  # bytes of the buffer


def beta(nbytes):
    return nbytes * 8 / (GBPS * 1e9)


def cluster(nodes, ranks, rule="mpich", step_s=0.010):
    """Shared memory free (no sweeps, no syncs): only the network and compute cost."""
    node = Node(step_s=step_s, byte_s=0.0, sync_s=0.0, ranks=ranks, cores=ranks)
    return Cluster(nodes, node, NetworkModel(ALPHA * 1e6, GBPS), rule)


def test_mpich_rabenseifner_pays_only_the_rounds_between_nodes():
    # 4 nodes x 2 ranks: the first halving round stays in the node, two cross.
    got = world_allreduce(cluster(4, 2), "mpi", N, 4)
    assert got == pytest.approx(2 * 2 * ALPHA + beta(2 * 3 / 8 * N))


def test_mpich_folds_a_world_that_is_not_a_power_of_two():
    # 3 nodes: rank 0 hands its buffer to rank 1 and gets the sum back (2 x whole
    # buffer), then ranks 1 and 2 halve and double (2 x half the buffer).
    assert rail_allreduce(cluster(3, 1), N, 4) == pytest.approx(4 * ALPHA + beta(3 * N))


def test_mpich_small_messages_use_recursive_doubling():
    assert mpich_algorithm(8, 2048, 4) == "recursive doubling"
    assert mpich_algorithm(8, 4096, 4) == "Rabenseifner"
    assert mpich_algorithm(1024, 3000, 4) == "recursive doubling"  # 750 elements < 1024
    # doubling sends the whole buffer in each of log2(8) = 3 rounds, all across nodes
    assert world_allreduce(cluster(8, 1), "mpi", 2048, 4) == pytest.approx(
        3 * (ALPHA + beta(2048)))


def test_ranks_sharing_a_link_share_its_bandwidth():
    one_nic = dataclasses.replace(cluster(2, 2), links=1)
    # the two rails of the hierarchical allreduce send at once through one link
    assert world_allreduce(one_nic, "hierarchical", N, 4) == pytest.approx(
        2 * ALPHA + beta(N))
    assert world_allreduce(cluster(2, 2), "hierarchical", N, 4) == pytest.approx(
        2 * ALPHA + beta(N / 2))
    # DASO's global sync uses one rail: nothing shared
    assert rail_allreduce(one_nic, N, 4) == rail_allreduce(cluster(2, 2), N, 4)


def test_emulated_rule_charges_what_network_py_charges():
    # A flat allreduce over N = 4 ranks: 2(N-1) messages and 2(N-1)/N of the bytes.
    emulated = cluster(2, 2, rule="emulated")
    assert world_allreduce(emulated, "mpi", N, 4) == pytest.approx(6 * ALPHA + beta(1.5 * N))
    # the hierarchical rails: a ring over P = 2 nodes on the slice of n / G
    assert world_allreduce(emulated, "hierarchical", N, 4) == pytest.approx(
        2 * ALPHA + beta(N / 2))


def test_sync_epoch_is_compute_plus_allreduce_per_step():
    c = cluster(2, 2, rule="emulated")
    epoch = sync_epoch(c, 10, N, 4, "mpi")
    assert epoch.compute_s == pytest.approx(10 * 0.010)
    assert epoch.comm_s == pytest.approx(10 * (6 * ALPHA + beta(1.5 * N)))
    assert epoch.label == "sync mpi"


def test_oversubscription_multiplies_compute():
    node = Node(step_s=0.010, byte_s=0.0, sync_s=0.0, ranks=2, cores=1)
    epoch = sync_epoch(Cluster(2, node, NetworkModel(), "emulated"), 10, N, 4, "mpi")
    assert node.share == 2 and epoch.compute_s == pytest.approx(0.2)
    assert epoch.comm_s == 0


def test_each_barrier_and_blocking_collective_is_a_sync_point():
    node = Node(step_s=0.0, byte_s=0.0, sync_s=0.001, ranks=2, cores=2)
    free = Cluster(2, node, NetworkModel(), "emulated")
    # the world meets once; hierarchical: node barrier, rails, node barrier
    assert world_allreduce(free, "mpi", N, 4) == pytest.approx(0.001)
    assert world_allreduce(free, "hierarchical", N, 4) == pytest.approx(0.003)
    # daso blocking: node allreduce (2 barriers), the rail meets, node broadcast (1)
    assert daso_epoch(free, 1, N, 4, (0, 0, 0)).comm_s == pytest.approx(0.004)


def test_hbsgd_averages_every_k_steps_and_at_the_epoch_end():
    c = cluster(2, 2, rule="emulated")
    epoch = hbsgd_epoch(c, 10, N, 4, 4)  # averages after steps 4, 8 and at the end
    assert epoch.comm_s == pytest.approx(3 * (2 * ALPHA + beta(N / 2)))


def test_hsgd_parameter_averaging_counts_both_levels():
    c = cluster(2, 2, rule="emulated")
    options = {"average": "parameters", "level1_period": 2, "level2_period": 4}
    # 10 steps: world averages after steps 4, 8 and at the end; node averages after 2, 6, 10
    # (free here: shared memory costs nothing in these clusters)
    epoch = hsgd_epoch(c, 10, N, 4, options)
    assert epoch.setting == "parameters (2,4)"
    assert epoch.comm_s == pytest.approx(3 * (2 * ALPHA + beta(N / 2)))


def test_daso_blocking_waits_for_every_sum_cycling_hides_one_batch():
    c = cluster(2, 2, rule="emulated", step_s=0.005)
    total = 2 * ALPHA + beta(N)  # the rail's ring over 2 nodes on the whole buffer: 8.5 ms
    blocking = daso_epoch(c, 8, N, 4, (0, 0, 0))
    assert blocking.setting == "blocking (0,0,0)"
    assert blocking.comm_s == pytest.approx(8 * total)
    # (4,1,1): sends after batches 0 and 4 merge one batch later, waiting for what one
    # batch of compute did not cover; the last batch's send is blocking.
    cycling = daso_epoch(c, 8, N, 4, (4, 1, 1))
    assert cycling.setting == "cycling (4,1,1)"
    assert cycling.comm_s == pytest.approx(2 * (total - 0.005) + total)
    assert cycling.compute_s == pytest.approx(0.040)


def test_unmodelled_strategy_is_an_error_naming_it_and_the_allowed():
    with pytest.raises(ValueError, match=r"--strategy: got 'asgd', allowed: sync, hsgd, "
                                         r"hbsgd, daso, easgd-rr, easgd-sync; the "
                                         r"parameter-server"):
        parse_strategies("sync,asgd", [])
    with pytest.raises(ValueError, match="--strategy: got 'nope', allowed: sync, hsgd, hbsgd, "
                                         "daso, easgd-rr, easgd-sync$"):
        parse_strategies("nope", [])
    with pytest.raises(ValueError, match="--set: got 'daso.k=2'"):
        parse_strategies("hbsgd", ["daso.k=2"])
    with pytest.raises(ValueError, match="hbsgd.k: got 0"):
        parse_strategies("hbsgd", ["hbsgd.k=0"])
    assert parse_strategies("hbsgd", ["hbsgd.k=8"])["hbsgd"]["k"] == 8


def test_bad_flags_name_the_flag_and_the_value(capsys):
    with pytest.raises(ValueError, match="--nodes: got '2,x'"):
        parse_nodes("2,x")
    assert parse_nodes("8,2,4,2") == [2, 4, 8]
    assert main(["--nodes", "4", "--samples", "100", "--step-ms", "1", "--mem-gbps", "5",
                 "--model", "mlp"]) == 2
    assert "--samples: got 100, allowed: at least 512" in capsys.readouterr().err
    assert main(["--cores-per-node", "0", "--step-ms", "1"]) == 2
    assert "--cores-per-node: got 0.0, allowed: a finite number > 0" in capsys.readouterr().err


def test_command_prints_a_row_per_strategy_and_p_and_where_scaling_stops(capsys):
    assert main(["--nodes", "2,4,8", "--model", "mlp", "--step-ms", "3", "--mem-gbps", "5",
                 "--net-latency-us", "50", "--net-bandwidth-gbps", "1"]) == 0
    out = capsys.readouterr().out
    for label in ("sync mpi", "hsgd gradients", "hbsgd k=4", "daso blocking (0,0,0)",
                  "daso cycling (4,1,1)"):
        assert sum(line.startswith(f"| {label.rjust(21)} |") for line in out.splitlines()) == 3
        assert f"\n{label}: epoch time" in out
    assert "Rabenseifner" in out


def test_validation_binds_each_virtual_node_to_cores_of_its_own():
    mpich = "MPICH Version:      5.0.2"
    assert binding([[0], [1]], 2, mpich) == ["-bind-to", "user:0,0,1,1"]
    assert binding([[0, 1], [2, 3]], 1, mpich) == ["-bind-to", "user:0+1,2+3"]
    # Open MPI's mpiexec takes no per-rank core list on its command line: unbound
    assert binding([[0], [1]], 2, "Open MPI v4.1.4, package: Debian OpenMPI") == []
    with pytest.raises(ValueError, match="--nodes: got 100000 with --validate, allowed: at most"):
        node_cores(100000, None)
    with pytest.raises(ValueError, match="--cores-per-node: got 0.5 for 1 virtual nodes"):
        node_cores(1, 0.5)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores: one per node")
def test_validation_runs_the_real_2x2_job_beside_its_prediction(synthetic_data_dir):
    """A real job (sync, 2 nodes x 2 ranks, network model on) against its prediction.

    How close the two are is a measurement, not an assertion (docs/simulate.md has the
    table for all four strategies): the ranks share this machine's cores with whatever
    else runs. What holds on any machine: the measured epoch is at least what the network
    model charged for its allreduces (it sleeps the remainder of every charge).
    """
    args = add_arguments(argparse.ArgumentParser()).parse_args([
        "--nodes", "2", "--ranks-per-node", "2", "--strategy", "sync", "--model", "mlp",
        "--dataset", "synthetic", "--samples", "6144", "--epochs", "2",
        "--net-latency-us", "50", "--net-bandwidth-gbps", "1", "--validate",
        "--data-dir", synthetic_data_dir])
    s = setup(args)
    [row] = compare(args, s)
    assert row.epochs == [2]
    batches = 6144 // 4 // args.batch_size
    charged = batches * NetworkModel(50, 1).seconds(*ring_traffic(4, s.nbytes))
    assert row.measured_s >= charged > 0, (row.measured_s, charged)
    assert row.predicted.seconds >= charged and row.predicted.batches == batches


@pytest.mark.parametrize("flags, message", [
    (["--net-latency-us", "2e6"], "--net-latency-us: got 2000000.0, allowed: a finite number "
                                  "in [0, 1e+06] (microseconds per message)"),
    (["--net-bandwidth-gbps", "1e-9"], "--net-bandwidth-gbps: got 1e-09, allowed: 0 "
                                       "(unlimited) or a finite number in [0.001, 1e+06]"),
    (["--strategy", "daso", "--set", "daso.staleness_weight=inf"],
     "daso.staleness_weight: got inf, allowed: a finite number, a float > 0"),
], ids=["latency", "bandwidth", "option"])
def test_what_train_refuses_simulate_refuses_in_trains_words(capsys, flags, message):
    assert main(["--nodes", "2", "--step-ms", "1", "--mem-gbps", "5", *flags]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


def test_a_validation_run_that_fails_is_one_line_and_exit_1(tmp_path, capsys):
    not_a_directory = tmp_path / "data"
    not_a_directory.write_text("a user's file\n")
    assert main(["--nodes", "1", "--ranks-per-node", "1", "--strategy", "sync", "--model",
                 "mlp", "--dataset", "synthetic", "--samples", "512", "--epochs", "1",
                 "--step-ms", "1", "--mem-gbps", "5", "--validate", "--data-dir",
                 str(not_a_directory)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: simulate --validate: a run failed (exit 2), its last line: "
                          "error: "), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert f"-- the run: {launcher.mpiexec()} " in err
    assert not_a_directory.read_text() == "a user's file\n"
