"""minidp: data-parallel deep learning in plain Python on NumPy/CuPy, with MPI.

Thread limits are exported before NumPy is first imported (see :mod:`minidp.threads`),
so BLAS starts with one thread per rank when several ranks share a node, and
glibc's malloc is told to keep large temporaries in the heap (:mod:`minidp.allocator`).

Modules that moved into packages keep their old import paths (``minidp.train``,
``minidp.config``, ...): :class:`_MovedModules` imports the new module under the old
name, with a ``DeprecationWarning`` that names the new path.

The first statement is not about the package: in a process started as ``minidp train``
it catches the stop signals before NumPy, Numba and MPI load (:mod:`minidp.run.signals`,
a module that imports nothing), because a scheduler's signal does not wait for them.
"""

from minidp.run.signals import catch_if_minidp_train

catch_if_minidp_train()

import importlib  # noqa: E402 (after the signals, on purpose)
import importlib.abc  # noqa: E402
import importlib.machinery  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

from minidp import allocator as _allocator  # noqa: E402
from minidp import threads as _threads  # noqa: E402

_threads.set_thread_environment()
_threads.limit_threads()
_allocator.tune_malloc()

from minidp import functional  # noqa: E402
from minidp.autograd.function import Function, no_grad  # noqa: E402
from minidp.autograd.tensor import Tensor  # noqa: E402
from minidp.backend import get_backend, set_backend  # noqa: E402

__version__ = "0.1.0"

__all__ = ["Function", "Tensor", "functional", "get_backend", "no_grad", "set_backend",
           "__version__"]

MOVED = {
    "minidp.train": "minidp.run.trainer", "minidp.train_state": "minidp.run.state",
    "minidp.config": "minidp.run.config minidp.run.flags",
    "minidp.checkpoint": "minidp.run.checkpoint",
    "minidp.rundir": "minidp.run.rundir", "minidp.stopping": "minidp.run.stopping",
    "minidp.faults": "minidp.run.faults", "minidp.console": "minidp.run.console",
    "minidp.replica": "minidp.run.replica", "minidp.report": "minidp.run.files",
    "minidp.reports": "minidp.reporting.report", "minidp.plots": "minidp.reporting.plots",
    "minidp.compare": "minidp.reporting.compare", "minidp.tensor": "minidp.autograd.tensor",
    "minidp.function": "minidp.autograd.function", "minidp.ops": "minidp.autograd.ops",
    "minidp.testing": "minidp.autograd.gradcheck",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import minidp.train`` gives :mod:`minidp.run.trainer`, with a warning naming it.

    The old name becomes a new module object holding the new modules' names, so each
    new module keeps its own ``__spec__`` and ``__name__``. A moved package's modules
    move with it (``minidp.ops.conv`` is ``minidp.autograd.ops.conv``).
    """

    @staticmethod
    def new_names(name: str) -> list[str]:
        """The modules that replace ``name`` (empty: it did not move)."""
        old = next((o for o in MOVED if name == o or name.startswith(o + ".")), None)
        return [] if old is None else [n + name[len(old):] for n in MOVED[old].split()]

    def find_spec(self, name, path=None, target=None):  # noqa: D102 (importlib's protocol)
        return importlib.machinery.ModuleSpec(name, self) if self.new_names(name) else None

    def create_module(self, spec):  # noqa: D102
        return None  # the default module object

    def exec_module(self, module):  # noqa: D102
        new = self.new_names(module.__name__)
        warnings.warn(f"{module.__name__} moved to {' and '.join(new)}; import that instead",
                      DeprecationWarning, stacklevel=2)
        for name in new:
            target = importlib.import_module(name)
            module.__dict__.update({k: v for k, v in vars(target).items()
                                    if not k.startswith("__")})
            if hasattr(target, "__path__"):
                module.__path__ = []  # a package: its modules are found here too


sys.meta_path.insert(0, _MovedModules())  # before the file system's finder
