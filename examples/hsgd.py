r"""HSGD with LARS: two-level synchronous SGD, the node through shared memory.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py examples/hsgd.py [--epochs 4]

4 ranks as 2 virtual nodes of 2, batch 64 per worker. Level 1 averages inside each
node through an MPI shared-memory window, level 2 across the nodes over the rails; the
large-batch recipe of the LARS paper (warm-up, then polynomial decay of power 2) runs
on top, LARS applied to the averaged gradient. The same from the command line::

    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py -m minidp train --strategy hsgd \
        --ranks-per-node 2 --batch-size 64 --optimizer lars --lr 20 --momentum 0.9 \
        --trust-coefficient 0.001 --weight-decay 5e-4 --schedule poly --warmup-epochs 1
"""

from common import data_settings, parser
from mpi4py import MPI

from minidp.run.config import TrainConfig
from minidp.run.trainer import Trainer

args = parser(__doc__, epochs=4).parse_args()
config = TrainConfig(**data_settings(args), model="lenet5", strategy="hsgd", batch_size=64,
                     optimizer="lars", lr=20.0, momentum=0.9, trust_coefficient=0.001,
                     weight_decay=5e-4, schedule="poly", warmup_epochs=1, ranks_per_node=2,
                     out="runs/example-hsgd", overwrite=True,
                     options={"average": "gradients"})
summary = Trainer(config).fit()
if MPI.COMM_WORLD.rank == 0:
    print(f"hsgd + LARS: {summary['final']['test_accuracy']:.2%} in {summary['wall_s']:.0f} s")
