"""Run the MPI examples named on the command line in this one job, one after the other.

    mpiexec -n 4 python -m mpi4py tests/scripts/run_examples.py DIR "EXAMPLE ARGS" ...

Each argument after the working directory DIR is an example's file name and its flags.
Every example runs as ``python -m mpi4py examples/NAME.py FLAGS`` would run it from DIR
(``__main__``, its own ``sys.argv``, ``examples/`` first on the path), with the
process-wide settings a new process starts with (no network model), so one launch pays
the start-up once.
"""

import os
import runpy
import shlex
import sys

from mpi4py import MPI

from minidp.comm import NetworkModel, set_network_model

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples")

sys.path.insert(0, EXAMPLES)
os.chdir(sys.argv[1])
for item in sys.argv[2:]:
    name, *flags = shlex.split(item)
    set_network_model(NetworkModel())
    sys.argv = [os.path.join(EXAMPLES, name), *flags]
    if MPI.COMM_WORLD.rank == 0:
        print(f"== {name}", flush=True)
    runpy.run_path(sys.argv[0], run_name="__main__")
