"""Every ``MINIDP_*`` variable checked when a command starts: one line naming a bad one.

minidp reads its variables where they are used, some only deep inside a run (the
progress interval when the first epoch starts, the CUDA kernels at their first launch)
and some at ``import minidp``, which must never fail on them. So a garbage value would
either surface late, far from its cause, or be taken silently for something else
(``MINIDP_HOST_REPLICA=yes`` read as on, ``MINIDP_CUDA_KERNELS=off`` as on). Every
command of ``python -m minidp`` therefore calls :func:`check` first (``train`` inside its
collective error report, so a job's ranks print it once); it raises ValueError naming
the first bad variable, its value and what is allowed, which the command line prints as
``error: ...`` with exit status 2. ``info`` does not refuse: it shows the problem.

Each variable is parsed by the module that uses it, so a value accepted here is read
the same way there:

===========================  ==============================================================
``MINIDP_BACKEND``           :func:`minidp.backend.check_environment` (also: cupy here?)
``MINIDP_NUM_THREADS``,      :func:`minidp.threads.check` (``OMP_NUM_THREADS`` too)
``MINIDP_THREAD_DEFAULTS``
``MINIDP_COMM_TIMEOUT``,     :mod:`minidp.comm.guard`
``MINIDP_DEBUG``
``MINIDP_PROGRESS``,         :mod:`minidp.run.console`
``MINIDP_PROGRESS_SECONDS``,
``MINIDP_EXPLAIN``
``MINIDP_CUDA_KERNELS``,     :data:`SWITCHES` here: ``0`` or ``1`` (empty: the default), the
``MINIDP_HOST_REPLICA``,     only values whose meaning the code that reads them agrees on
``MINIDP_MALLOC_TUNING``
``MINIDP_MPIEXEC_ARGS``      split as a shell would (``simulate --validate --real-nodes``)
===========================  ==============================================================

``tests/unit/test_environment.py`` gives every variable that the package reads a
garbage value and expects this check to name it.
"""

from __future__ import annotations

import os
import shlex

from minidp import backend, threads
from minidp.comm import guard
from minidp.run import console

# Read as on/off by code that compares with "0" (allocator.py, kernels/cuda.py, replica.py):
# only "0" and "1" mean the same there and here; unset or empty is the default.
SWITCHES = {"MINIDP_CUDA_KERNELS": "1: minidp's CUDA kernels (default), 0: NumPy's code",
            "MINIDP_HOST_REPLICA": "1: compute on a host replica, 0: on the model (default)",
            "MINIDP_MALLOC_TUNING": "1: raise glibc's malloc thresholds (default), 0: leave "
                                    "them"}
MPIEXEC_ARGS = "MINIDP_MPIEXEC_ARGS"


def check_switch(name: str) -> None:
    """Raise ValueError unless the switch ``name`` is unset, empty, ``0`` or ``1``."""
    text = os.environ.get(name, "")
    if text not in ("", "0", "1"):
        raise ValueError(f"{name}: got {text!r}, allowed: 0 or 1 ({SWITCHES[name]})")


def mpiexec_args() -> list[str]:
    """``MINIDP_MPIEXEC_ARGS`` split as a shell would; ValueError naming a value it cannot."""
    text = os.environ.get(MPIEXEC_ARGS, "")
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"{MPIEXEC_ARGS}: got {text!r}, allowed: mpiexec arguments as a "
                         f"shell splits them ({str(exc).lower()})") from None


def check() -> None:
    """Raise ValueError naming the first ``MINIDP_*`` (or thread) variable with a bad value."""
    backend.check_environment()
    threads.check()
    guard.timeout_from_environment()
    guard.debug_from_environment()
    console.progress_mode(False)
    console.line_seconds()
    console.explain_steps(0)
    for name in SWITCHES:
        check_switch(name)
    mpiexec_args()
