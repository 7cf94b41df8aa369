"""Run with plain ``python`` (not ``-m mpi4py``): minidp's hook must abort the job."""

from mpi4py import MPI

from minidp.comm.guard import install_abort_hook

install_abort_hook()
if MPI.COMM_WORLD.rank == 1:
    raise RuntimeError("rank 1 fails on purpose")
MPI.COMM_WORLD.Barrier()
