"""The elastic-averaging family side by side: five ways to pull workers towards a centre.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py examples/easgd.py [--epochs 2]

4 ranks as 2 virtual nodes x 2 with the network model on (50 us, 1 Gbit/s between
nodes), the MLP for 2 epochs, each variant with its default learning rate
(docs/configuration.md). ``easgd-rr``, ``easgd-async`` and ``measgd-async`` make rank 0
the master holding the centre (3 workers); ``easgd-hogwild`` keeps one centre per node
in shared memory; ``easgd-sync`` makes every rank a worker and moves the workers' sum
by a tree reduce. Each run prints the centre's accuracy (the model that is evaluated
and saved), its time, and the bytes it sent between nodes.
"""

from common import data_settings, parser
from mpi4py import MPI

from minidp.run.config import TrainConfig
from minidp.run.trainer import Trainer

args = parser(__doc__, epochs=2).parse_args()
for strategy in ("easgd-rr", "easgd-async", "measgd-async", "easgd-hogwild", "easgd-sync"):
    config = TrainConfig(**data_settings(args), model="mlp", strategy=strategy,
                         ranks_per_node=2, net_latency_us=50, net_bandwidth_gbps=1,
                         progress=False, out=f"runs/example-{strategy}", overwrite=True)
    summary = Trainer(config).fit()
    if MPI.COMM_WORLD.rank == 0:
        exchanges = summary["epochs"][-1]["strategy"]["worker_exchanges"]
        print(f"{strategy:>13}: centre {summary['final']['test_accuracy']:.2%} after "
              f"{summary['wall_s']:.1f} s, {summary['bytes_sent']['inter'] / 1e9:.2f} GB "
              f"between nodes, exchanges per worker in the last epoch {exchanges}")
