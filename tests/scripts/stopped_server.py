"""A parameter server stopped (SIGSTOP) while its worker waits for its answer, point to point.

Rank 0 plays the server: its status board says it waits in ``serve test`` when it stops
itself. Rank 1, the worker, waits for rank 0's message with a 2-second timeout: the
timeout must name rank 0 as stopped, not as "waiting in 'serve test'" (its board record
says that, but a stopped process waits for nothing). Then the worker wakes the server
(SIGCONT), the message arrives, and both end normally. Rank 1 prints the timeout's
message for tests/test_stopped_server.py.
"""

import os
import signal

import numpy as np
from mpi4py import MPI

from minidp.comm import Topology, guard

Topology()  # builds the status board
world = MPI.COMM_WORLD
board = guard._board["board"]
answer = np.zeros(1)
if world.rank == 0:
    guard.barrier(world, "the server is about to stop")  # the worker posts after it
    board.enter("serve test", 1)  # as a server waiting for its workers' messages
    os.kill(os.getpid(), signal.SIGSTOP)
    board.leave()
    world.Send(np.ones(1), dest=1, tag=5)
else:
    guard.barrier(world, "the server is about to stop")
    request = world.Irecv(answer, source=0, tag=5)
    guard.set_timeout(2)
    try:
        guard.poll_peers(request.Test, world, [0], "recv the answer from rank 0")
        print("no timeout", flush=True)
    except guard.CommTimeout as timeout:
        print(f"timeout: {timeout}", flush=True)
    os.kill(int(board.records[board.slots[0]]["pid"]), signal.SIGCONT)
    request.Wait()
guard.barrier(world, "done")
