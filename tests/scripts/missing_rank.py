"""Purpose-made missing rank: rank 1 computes instead of joining the allreduce."""

import time

import numpy as np

from minidp.comm import Topology, allreduce
from minidp.comm.guard import set_timeout

topology = Topology(ranks_per_node=1)
set_timeout(3)
if topology.rank == 1:
    time.sleep(40)
allreduce(np.ones(10), topology, "hierarchical")
