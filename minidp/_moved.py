"""Old import paths of modules (and names) that moved: they keep working, and say where to.

``import minidp.train`` gives :mod:`minidp.run.trainer` under the old name, with a
``DeprecationWarning`` that names the new module (:class:`MovedModules`, installed on
``sys.meta_path`` by ``minidp/__init__.py``). A name that moved out of a module that is
still there (``minidp.optim.sgd.LARS``, now in :mod:`minidp.optim.lars`) is found by the
module's ``__getattr__`` from :func:`moved_names`, with the same warning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import warnings
from collections.abc import Callable
from typing import Any

# old module -> its new module(s), space-separated (a module split in several files)
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
    # strategy files named as the ids they hold (issue 38)
    "minidp.strategies.ps": "minidp.strategies.ps_base",
    "minidp.strategies.easgd": "minidp.strategies.easgd_base minidp.strategies.easgd_rr "
                               "minidp.strategies.easgd_async minidp.strategies.easgd_hogwild",
    "minidp.strategies.measgd": "minidp.strategies.measgd_async",
    # point-to-point in one vocabulary: p2p (messages), p2p_request, p2p_wait (issue 38)
    "minidp.comm.peers": "minidp.comm.p2p_wait",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
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


def moved_names(module: str, names: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that finds ``names`` (name -> new module) where they went.

    Args:
        module: the module that held them (for the messages).
        names: each moved name and the module that holds it now.
    """

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} moved to {names[name]}.{name}; import it from there",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(names[name]), name)

    return __getattr__
