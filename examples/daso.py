"""DASO: node-local sync every batch, global averaging every B batches over all rails, adaptive.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py examples/daso.py [--epochs 5]

4 ranks as 2 virtual nodes of 2, an MLP, a network model of 50 us and 1 Gbit/s between
nodes. A global sync crosses the nodes on every rail at once (``global_sync=all``, the
default): local rank j carries slice j, 1/G of the parameters, on its own rail, so the
node's whole link works; ``--set daso.global_sync=rail`` is Heat's form, one rail at a
time carrying all of them (the same numbers: docs/daso.md).

The loop is the Trainer's public API written out: ``Trainer(config)`` sets up
(topology, data, model, strategy), ``train_epoch(epoch)`` trains one epoch on every
rank and returns its metrics (``fit()`` is this loop plus the run directory, resume,
checkpoints and the summary). Prints each epoch's (B, S, L) from DASO's schedule (a
short run: warm-up and cool-down of 1 epoch instead of Heat's 4, so epochs 2 to
``--epochs``-1 cycle) with the epoch's time and the share of it spent communicating.
"""

from common import data_settings, parser
from mpi4py import MPI

from minidp.run.config import TrainConfig
from minidp.run.trainer import Trainer

args = parser(__doc__, epochs=5).parse_args()
config = TrainConfig(**data_settings(args), model="mlp", strategy="daso", ranks_per_node=2,
                     net_latency_us=50, net_bandwidth_gbps=1, progress=False,
                     options={"warmup_epochs": 1, "cooldown_epochs": 1})
trainer = Trainer(config)
for epoch in range(config.epochs):
    skips = trainer.strategy.schedule.values
    m = trainer.train_epoch(epoch)
    if MPI.COMM_WORLD.rank == 0:
        print(f"epoch {epoch + 1}: (B, S, L) = {skips}  {m['wall_s']:.1f} s, communication "
              f"{m['comm_s'] / m['wall_s']:.0%}, test accuracy {m['test_accuracy']:.2%}")
