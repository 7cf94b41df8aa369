"""Every strategy with the command line's defaults, in turn, in this one job.

    mpiexec -n 4 python -m mpi4py tests/scripts/strategy_defaults.py DIR "STRATEGY EPOCHS" ...

Each configuration is parsed by ``minidp train``'s own parser from nothing but
``--strategy``, ``--epochs``, the data set (mnist-5k, prepared in DIR/data) and the
virtual nodes (2 x 2); learning rate, momentum, batch size and every option are the
defaults. The epochs are the Trainer's ``train_epoch`` (no run directory is written).
Rank 0 prints one JSON line per run: the settings used, and the test accuracy and the
training loss of each epoch.
"""

import argparse
import json
import os
import sys

from mpi4py import MPI

from minidp.run.flags import build_parser, from_args
from minidp.run.trainer import Trainer

directory = sys.argv[1]
for item in sys.argv[2:]:
    strategy, epochs = item.split()
    argv = ["--strategy", strategy, "--epochs", epochs, "--dataset", "mnist-5k",
            "--data-dir", os.path.join(directory, "data"), "--ranks-per-node", "2",
            "--no-progress"]
    config = from_args(build_parser(argparse.ArgumentParser()).parse_args(argv))
    trainer = Trainer(config)
    epochs = [trainer.train_epoch(epoch) for epoch in range(config.epochs)]
    if MPI.COMM_WORLD.rank == 0:
        print(json.dumps({"strategy": strategy, "lr": config.lr, "momentum": config.momentum,
                          "batch_size": trainer.batch_size,
                          "accuracy": [m["test_accuracy"] for m in epochs],
                          "train_loss": [m["train_loss"] for m in epochs]}), flush=True)
