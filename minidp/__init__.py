"""minidp: data-parallel deep learning in plain Python on NumPy/CuPy, with MPI.

Thread limits are exported before NumPy is first imported (see :mod:`minidp.threads`),
so BLAS starts with one thread per rank when several ranks share a node, and its idle
threads (and OpenMP's) sleep instead of spinning on a core another pool needs, and
glibc's malloc is told to keep large temporaries in the heap (:mod:`minidp.allocator`).
In a minidp command, Python's garbage collector is paused while the package imports
(:mod:`minidp.run.collector`).

Modules that moved keep their old import paths (``minidp.train``, ``minidp.config``,
``minidp.strategies.easgd``, ...): :mod:`minidp._moved` imports the new module under the
old name, with a ``DeprecationWarning`` that names the new path.

The first statement is not about the package: in a process started as ``minidp train``
it catches the stop signals before NumPy, Numba and MPI load (:mod:`minidp.run.signals`,
a module that imports nothing), because a scheduler's signal does not wait for them.
"""

from minidp.run.signals import catch_if_minidp_train

catch_if_minidp_train()

import sys  # noqa: E402 (after the signals, on purpose)

from minidp.run import collector as _collector  # noqa: E402

# A minidp command's imports make some 100,000 objects and no garbage: no collection
# walks them (minidp/run/collector.py).
_collector.pause_for_command()

from minidp import _moved  # noqa: E402
from minidp import allocator as _allocator  # noqa: E402
from minidp import threads as _threads  # noqa: E402

_threads.set_thread_environment()
with _threads.idle_wait_settings():  # NumPy loads OpenBLAS here, Numba its OpenMP
    _threads.limit_threads()
_allocator.tune_malloc()

from minidp import functional  # noqa: E402
from minidp.autograd.function import Function, no_grad  # noqa: E402
from minidp.autograd.tensor import Tensor  # noqa: E402
from minidp.backend import get_backend, set_backend  # noqa: E402

__version__ = "0.1.0"

__all__ = ["Function", "Tensor", "functional", "get_backend", "no_grad", "set_backend",
           "__version__"]

sys.meta_path.insert(0, _moved.MovedModules())  # before the file system's finder
