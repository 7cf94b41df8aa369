"""Asynchronous SGD under a straggler: sync waits for the slow worker, asgd and dbs do not.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py examples/asgd.py [--epochs 2]

4 ranks; rank 3 computes 6x slower (``slowdown="3:6"``: far beyond what a busy machine
does to the others). ``sync`` has 4 workers that wait for rank 3 every step. ``asgd``
and ``dbs`` make rank 0 a parameter server and ranks 1-3 workers: an epoch is a budget
of samples, so the fast workers take most of it; ``dbs`` also gives each worker a batch
size proportional to its measured speed, so gradients arrive in turn and are about
equally stale. Each strategy trains with its own default learning rate and momentum
(docs/configuration.md). Each run prints its time, its accuracy, and what the server saw
(updates, staleness, samples per worker).
"""

from common import data_settings, parser
from mpi4py import MPI

from minidp.run.config import TrainConfig
from minidp.run.trainer import Trainer

args = parser(__doc__, epochs=2).parse_args()
for strategy in ("sync", "asgd", "dbs"):
    config = TrainConfig(**data_settings(args), model="lenet5", strategy=strategy,
                         slowdown="3:6", progress=False, out=f"runs/example-asgd-{strategy}",
                         overwrite=True)
    summary = Trainer(config).fit()
    if MPI.COMM_WORLD.rank == 0:
        last = summary["epochs"][-1]
        print(f"{strategy:>5}: {summary['final']['test_accuracy']:.2%} after "
              f"{summary['wall_s']:.1f} s")
        stats = last.get("strategy")
        if stats:
            print(f"       updates {stats['updates']}, staleness mean "
                  f"{stats['staleness_mean']:.1f} max {stats['staleness_max']}, samples per "
                  f"worker {stats['worker_samples']}, server busy "
                  f"{stats['server_busy_share']:.0%}")
            if "batch_sizes" in stats:
                print(f"       batch sizes {stats['batch_sizes']}")
