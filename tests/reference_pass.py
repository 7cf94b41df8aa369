"""Which unit test modules the NumPy reference pass runs, and the check that keeps it true.

``make test`` runs ``tests/unit`` twice: with the Numba kernels (``make test-suite``), and
under ``NUMBA_DISABLE_JIT=1`` (``make test-nojit``), where the gate in front of every kernel
(:func:`minidp.kernels.jit.use_kernels`) chooses its plain NumPy reference instead, the path
that CuPy arrays take too. A module whose tests never reach that gate, and never call a
kernel's Python body themselves, runs the same code in both passes: the reference pass
leaves it out (``MINIDP_REFERENCE_PASS=1``, set by the Makefile), which took that pass from
63 s to about 30 on 2 cores (configuration, run directories, reports, the replay's rules, the
docs' checks).

So that the list cannot go stale, the kernel pass checks every test of a listed module
(:func:`check_kernel_free`): one that reaches the gate in this process, or a module that
imports the kernels or Numba, fails, naming the module to take off the list. A test's child
processes are not watched; the modules listed start none that a kernel's result decides.
"""

from __future__ import annotations

import os
import sys

import pytest

KERNEL_FREE = frozenset(f"tests/unit/test_{name}.py" for name in (
    "arrows", "atomic", "checkpoints", "chrome_trace_check", "cifar_missing",
    "claims", "commands", "config", "config_page", "daso_batches", "daso_heat",
    "daso_schedule", "dbs_allocation", "docs_cite_files", "environment", "events_file",
    "guard_scan", "ignored_flags", "moved", "mutants_list", "read_the_code", "real_hosts",
    "reliability_table", "replay_rules", "reports", "rules_by_hand", "rundir",
    "schedules_pinned", "sequence", "serving_order", "signals", "simulate_elastic",
    "strategy_facts", "tensor_and_errors", "trace", "wire", "collector", "hand_over"))


def reference_pass() -> bool:
    """Whether this session is the NumPy reference pass (``make test-nojit``)."""
    return os.environ.get("MINIDP_REFERENCE_PASS") == "1"


def left_out() -> list[str]:
    """The modules the reference pass does not collect (paths relative to ``tests/``)."""
    return sorted(path[len("tests/"):] for path in KERNEL_FREE) if reference_pass() else []


_gate = {"calls": 0, "watching": False}


def _watch_the_gate() -> None:
    """Count calls of ``use_kernels`` from every minidp module that holds it, from now on.

    The kernel modules bind the gate by name when they are imported (``from ... import
    use_kernels``), so each holder's name is pointed at one counting wrapper of it, which
    returns what the gate returns: the tests' results are unchanged.
    """
    from minidp.kernels import jit

    gate = jit.use_kernels

    def counted(*arrays: object) -> bool:
        _gate["calls"] += 1
        return gate(*arrays)

    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "minidp" and getattr(module, "use_kernels", None) is gate:
            module.use_kernels = counted
    _gate["watching"] = True


def check_kernel_free(request: pytest.FixtureRequest) -> object:
    """Around one test: fail it if its module is listed but the test reached the gate."""
    path = os.path.relpath(str(request.path), os.path.dirname(os.path.dirname(__file__)))
    if path not in KERNEL_FREE or reference_pass():
        yield
        return
    with open(request.path) as f:
        source = f.read()
    if "minidp.kernels" in source or "import numba" in source:
        pytest.fail(f"{path} is listed in tests/reference_pass.py as free of the kernels, but "
                    "imports the kernels or Numba: take it off KERNEL_FREE", pytrace=False)
    if not _gate["watching"]:
        _watch_the_gate()
    before = _gate["calls"]
    yield
    if _gate["calls"] != before:
        pytest.fail(f"{path} is listed in tests/reference_pass.py as free of the kernels, but "
                    f"{request.node.name} reached minidp.kernels.jit.use_kernels "
                    f"{_gate['calls'] - before} time(s): take the module off KERNEL_FREE, so "
                    "that the reference pass runs it", pytrace=False)
