"""Purpose-made stopped rank: the last rank stops itself between a collective's barrier and call.

The others have seen it in the barrier, so they go on into the blocking call (``Split``),
where no poll runs and no timeout can fire: the guard's watchdog must name the stopped
rank and end the job (tests/test_stopped_rank.py).
"""

import os
import signal

from mpi4py import MPI

from minidp.comm import Topology, guard

Topology()  # builds the status board
guard.set_timeout(3)
world = MPI.COMM_WORLD
if world.rank == world.size - 1:
    guard.barrier(world, "split for the test")
    os.kill(os.getpid(), signal.SIGSTOP)
guard.collective(world, "split for the test", world.Split, 0, key=world.rank)
