"""HBSGD: gradient averaging inside each node every step, model averaging every K steps.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py examples/hbsgd.py [--epochs 2]

4 ranks as 2 virtual nodes of 2, with a network model of 50 us and 1 Gbit/s between
the nodes: compare the bytes sent across nodes (and the time) for K = 1, which is
synchronous SGD, and K = 8.
"""

from common import data_settings, parser
from mpi4py import MPI

from minidp.run.config import TrainConfig
from minidp.run.trainer import Trainer

args = parser(__doc__, epochs=2).parse_args()
for k in (1, 8):
    config = TrainConfig(**data_settings(args), model="lenet5", strategy="hbsgd",
                         ranks_per_node=2, net_latency_us=50, net_bandwidth_gbps=1,
                         options={"k": k}, out=f"runs/example-hbsgd-k{k}", overwrite=True,
                         progress=False)
    summary = Trainer(config).fit()
    if MPI.COMM_WORLD.rank == 0:
        print(f"K = {k}: {summary['final']['test_accuracy']:.2%}, {summary['wall_s']:.1f} s, "
              f"{summary['bytes_sent']['inter'] / 2**20:.0f} MiB across nodes")
