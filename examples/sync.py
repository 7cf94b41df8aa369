"""Synchronous data-parallel SGD written out by hand: the strategy API in your own loop.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py examples/sync.py --ranks-per-node 2

LeNet-5 on Fashion-MNIST (prepared into data/ by ``python -m minidp data prepare
fashion-mnist`` or by any ``minidp train`` run). Every rank reads its contiguous block
of the file with MPI-IO, computes its gradient, and ``strategy.step()`` averages the
gradients (hierarchical allreduce through the node's shared memory) and updates.
``python -m minidp train --strategy sync`` is this loop plus timing, outputs and
checkpoints.
"""

import argparse

import numpy as np

from minidp import Tensor, layers, no_grad, strategies
from minidp import functional as F
from minidp.comm import Topology, allreduce
from minidp.io.datasets import NORMALIZATION, normalize
from minidp.io.mdp import read_mdp
from minidp.io.readers import MPIIOReader
from minidp.optim import SGD


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks-per-node", type=int, default=None)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()

    topology = Topology(ranks_per_node=args.ranks_per_node)
    reader = MPIIOReader("data/fashion-mnist-train.mdp", topology.world, seed=0)
    mean, std = NORMALIZATION["fashion-mnist"]
    layers.manual_seed(0)
    model = layers.lenet5()
    optimizer = SGD(model.parameters(), lr=0.05, momentum=0.9)
    sync = strategies.get("sync", model, optimizer, topology)  # broadcasts rank 0's weights
    x_test, y_test, _ = read_mdp("data/fashion-mnist-test.mdp")
    mine = np.array_split(np.arange(len(y_test)), topology.size)[topology.rank]

    for epoch in range(args.epochs):
        for batch, (x, y) in enumerate(reader.iterate(epoch, batch_size=64)):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(Tensor(normalize(x, mean, std))), y)
            loss.backward()
            sync.step(batch)
        model.eval()
        with no_grad():
            out = model(Tensor(normalize(x_test[mine], mean, std)))
        model.train()
        correct = allreduce(np.array([float((out.data.argmax(1) == y_test[mine]).sum())]),
                            topology, "mpi")[0]
        if topology.rank == 0:
            print(f"epoch {epoch + 1}: test accuracy {correct / len(y_test):.2%}")


if __name__ == "__main__":
    main()
