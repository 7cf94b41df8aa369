"""Purpose-made deadlock: rank 0 waits for a message nobody sends."""

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
buf = np.empty(1)
if comm.rank == 0:
    comm.Recv(buf, source=MPI.ANY_SOURCE, tag=99)
comm.Barrier()
