"""The elastic-averaging family side by side: five ways to pull workers towards a centre.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py examples/easgd.py

4 ranks as 2 virtual nodes x 2 with the network model on (50 us, 1 Gbit/s between
nodes), the MLP on Fashion-MNIST for 2 epochs. ``easgd-rr``, ``easgd-async`` and
``measgd-async`` make rank 0 the master holding the centre (3 workers);
``easgd-hogwild`` keeps one centre per node in shared memory; ``easgd-sync`` makes
every rank a worker and moves the workers' sum by a tree reduce. Each run prints the
centre's accuracy (the model that is evaluated and saved), its time, and the bytes it
sent between nodes.
"""

from mpi4py import MPI

from minidp.run.config import TrainConfig
from minidp.run.trainer import Trainer

RUNS = {"easgd-rr": 0.1, "easgd-async": 0.1, "measgd-async": 0.02, "easgd-hogwild": 0.1,
        "easgd-sync": 0.1}

for strategy, lr in RUNS.items():
    config = TrainConfig(model="mlp", dataset="fashion-mnist", strategy=strategy, epochs=2,
                         batch_size=64, lr=lr, momentum=0.0, ranks_per_node=2,
                         net_latency_us=50, net_bandwidth_gbps=1, progress=False)
    summary = Trainer(config).fit()
    if MPI.COMM_WORLD.rank == 0:
        exchanges = summary["epochs"][-1]["strategy"]["worker_exchanges"]
        print(f"{strategy:>13}: centre {summary['final']['test_accuracy']:.2%} after "
              f"{summary['wall_s']:.1f} s, {summary['bytes_sent']['inter'] / 1e9:.2f} GB "
              f"between nodes, exchanges per worker in the last epoch {exchanges}")
