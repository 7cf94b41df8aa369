"""DASO: node-local sync every batch, global averaging on one rail at a time, adaptive.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py examples/daso.py

4 ranks as 2 virtual nodes of 2, an MLP on Fashion-MNIST, a network model of 50 us
and 1 Gbit/s between nodes. Prints each epoch's (B, S, L) from DASO's schedule (a short
run: warm-up and cool-down of 1 epoch instead of Heat's 4) with the epoch's time and
the share of it spent communicating.
"""

from mpi4py import MPI

from minidp.run.config import TrainConfig
from minidp.run.trainer import Trainer

config = TrainConfig(model="mlp", dataset="fashion-mnist", strategy="daso", epochs=5,
                     batch_size=64, lr=0.05, momentum=0.9, ranks_per_node=2,
                     net_latency_us=50, net_bandwidth_gbps=1, progress=False,
                     options={"warmup_epochs": 1, "cooldown_epochs": 1}, out="runs/example-daso",
                     overwrite=True)
trainer = Trainer(config)
for epoch in range(config.epochs):
    skips = trainer.strategy.schedule.values
    m = trainer.train_epoch(epoch)
    if MPI.COMM_WORLD.rank == 0:
        print(f"epoch {epoch + 1}: (B, S, L) = {skips}  {m['wall_s']:.1f} s, communication "
              f"{m['comm_s'] / m['wall_s']:.0%}, test accuracy {m['test_accuracy']:.2%}")
