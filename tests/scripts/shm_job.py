"""A job that holds MPI shared memory and waits: ``shm_job.py LIST [ignore-sigterm]``.

Every rank allocates a shared-memory window over its node (so the MPI library maps files
under /dev/shm), appends the /dev/shm files it maps to LIST (one path a line, read from
its own /proc/self/maps), then sleeps until it is ended. With ``ignore-sigterm`` it
ignores SIGTERM, as a rank stuck where no handler runs would: only SIGKILL ends it.
"""

import os
import signal
import sys
import time

from mpi4py import MPI

if sys.argv[2:] == ["ignore-sigterm"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
world = MPI.COMM_WORLD
node = world.Split_type(MPI.COMM_TYPE_SHARED)
window = MPI.Win.Allocate_shared(1 << 16, 1, comm=node)
world.Barrier()
with open("/proc/self/maps") as f:
    mine = sorted({line.split(None, 5)[-1].strip() for line in f if "/dev/shm/" in line
                   and not line.rstrip().endswith("(deleted)")})  # files that still exist
with open(sys.argv[1], "a") as f:
    f.write("".join(f"{path}\n" for path in mine))
    f.flush()
    os.fsync(f.fileno())
world.Barrier()
with open(sys.argv[1] + ".ready", "a") as f:
    f.write(f"{world.Get_rank()}\n")
time.sleep(600)
