"""``minidp simulate``'s elastic formulas on hand-computed cases (SC17's comparison).

The original EASGD's master serves the workers one at a time, so its round of exchanges
grows with the workers; Sync EASGD's two binomial trees grow with log2 of them.
"""

import pytest

from minidp.comm.network import NetworkModel
from minidp.simulate.command import main
from minidp.simulate.costs import Cluster, Node
from minidp.simulate.elastic import easgd_rr_epoch, easgd_sync_epoch

ALPHA, GBPS = 50e-6, 1.0
N = 2 ** 20  # bytes of the model


def message():
    return ALPHA + N * 8 / (GBPS * 1e9)


def cluster(nodes, ranks, step_s=0.010):
    """Shared memory free: only the network and compute cost."""
    node = Node(step_s=step_s, byte_s=0.0, sync_s=0.0, ranks=ranks, cores=ranks)
    return Cluster(nodes, node, NetworkModel(ALPHA * 1e6, GBPS))


def test_round_robin_serialises_the_workers_exchanges_at_the_master():
    # 8 nodes x 1: 7 workers, each exchange two messages across; the master's round of
    # 7 exchanges (14 messages) outlasts a worker's 10 ms of compute plus its own.
    epoch = easgd_rr_epoch(cluster(8, 1), batches=10, nbytes=N, tau=1)
    round_s = 7 * 2 * message()
    assert epoch.comm_s == pytest.approx(10 * (round_s - 0.010))
    assert epoch.compute_s == pytest.approx(10 * 0.010)
    # tau = 2: every other step exchanges
    assert easgd_rr_epoch(cluster(8, 1), 10, N, 2).comm_s == pytest.approx(5 * (round_s - 0.010))


def test_sync_pays_the_reduce_and_what_of_the_broadcast_the_next_compute_leaves():
    m = message()
    # 8 ranks on 8 nodes: 3 rounds up, every one across. Down: rank 0's 3 sends (25 ms,
    # one after the other on its link) outlast the 10 ms compute by 15 ms, but the 2
    # forwarding rounds below its children (17 ms) come after that compute: 2 m left.
    assert easgd_sync_epoch(cluster(8, 1), 10, N, 4, 1, "reduce").comm_s == pytest.approx(
        10 * (3 * m + 2 * m))
    # 2 nodes x 4: only the round whose pairs are 4 apart crosses (up); down, rank 0's one
    # crossing send hides behind the compute and the forwarding stays in the nodes
    assert easgd_sync_epoch(cluster(2, 4), 10, N, 4, 1, "reduce").comm_s == pytest.approx(
        10 * m)
    # 3 ranks: the fold, then one round up; down, rank 0's two sends beyond the compute
    assert easgd_sync_epoch(cluster(3, 1), 1, N, 4, 1, "reduce").comm_s == pytest.approx(
        2 * m + 2 * m - 0.010)


def test_at_the_papers_scale_round_robin_grows_with_p_the_trees_with_log2_p():
    # SC17's 8 and 64 workers, one per node, a step of 10 ms: round robin's step is
    # 2 (p - 1) messages; the trees' 10 ms + log2(p) messages up + log2(p) - 1 down.
    for p, rounds in ((8, 3), (64, 6)):
        rr = easgd_rr_epoch(cluster(p, 1), 10, N, 1)
        sync = easgd_sync_epoch(cluster(p, 1), 10, N, 4, 1, "reduce")
        assert rr.seconds / 10 == pytest.approx(2 * (p - 1) * message())
        assert sync.seconds / 10 == pytest.approx(0.010 + (2 * rounds - 1) * message())
        assert sync.comm_share < rr.comm_share


def test_the_command_predicts_both_on_request(capsys):
    assert main(["--strategy", "easgd-rr,easgd-sync", "--nodes", "4,32", "--model", "mlp",
                 "--step-ms", "3", "--mem-gbps", "5", "--net-latency-us", "50",
                 "--net-bandwidth-gbps", "1"]) == 0
    out = capsys.readouterr().out
    for label in ("easgd-rr tau=1", "easgd-sync reduce, tau=1"):
        assert sum(f" {label} |" in line for line in out.splitlines()) == 2
