"""Purpose-made failure: rank 1 raises while the others wait in a collective."""

from mpi4py import MPI

comm = MPI.COMM_WORLD
if comm.rank == 1:
    raise RuntimeError("rank 1 fails on purpose")
comm.Barrier()
