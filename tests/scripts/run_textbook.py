"""Run the strategy pages' textbook programs in this job and compare every run with its reference.

    mpiexec -n N python -m mpi4py tests/scripts/run_textbook.py DIR

Every run of ``tests/textbook_pages.py`` for this world size, in turn: the program is
written into DIR as its page shows it and runs as ``python FILE ARGS`` would (``runpy``,
``__main__``, its own ``sys.argv``; what it prints is kept apart), then once more with
its mutant; both are compared with the run's reference (``tests/textbook_reference.py``).
Rank 0 prints one line per comparison, ``TEXTBOOK {json}``, with ``case``, ``mutant``,
``bitwise`` (every array equal, bit for bit, on every rank), ``max_diff`` (the largest
difference of an element), ``distance`` (the largest ||run - reference|| / ||reference -
x_0|| over the arrays), ``moved`` (how far the reference got from x_0), ``compared``
(how many arrays, over the ranks) and, for ``dbs`` with several workers, the batch
sizes the run granted (shown, not judged: they follow timing). ``tests/test_textbook.py``
judges the rest.
"""

import contextlib
import io
import json
import os
import runpy
import sys

import numpy as np
from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import textbook_reference as reference  # noqa: E402 (the tests' folder, added above)
from textbook_pages import RUNS, programs  # noqa: E402

world = MPI.COMM_WORLD


def run_program(path: str, args: tuple[str, ...]) -> dict:
    """Run the program at ``path`` as ``python path args``; its module's globals."""
    sys.argv = [path, *args]
    with contextlib.redirect_stdout(io.StringIO()):
        names = runpy.run_path(path, run_name="__main__")
    world.Barrier()  # no rank starts the next program while another still runs this one
    return names


def reference_of(run, names: dict, trained: dict) -> tuple[dict, dict]:
    """This rank's reference arrays for ``run``, and the textbook's, by the same names.

    ``trained``: the production runs made so far, by case (a mutant's reference is its
    run's; the other references depend on what the program did).
    """
    if run.check == "production":
        if run.case not in trained:
            trained[run.case] = reference.production(run.strategy, run.options)
        expected = trained[run.case]
        return expected, {k: names[k] for k in expected}
    if run.check == "races":
        return races(run, names)
    workers = world.size - 1
    if run.strategy in ("easgd-async", "measgd-async"):
        xs = world.gather(names["x"] if world.rank else None, root=0)
        if world.rank:
            return {}, {}
        got = {"centre": names["centre"], **{f"x{r}": xs[r] for r in range(1, world.size)}}
        return reference.elastic_rules(run.options, names["log"], workers), got
    if world.rank:
        return {}, {}
    return reference.servers_rules(run.strategy, run.options, names["log"], workers), \
        {"x": names["x"]}


def races(run, names: dict) -> tuple[dict, dict]:
    """A lock-free run's shared array, and where the ranks' own writes take it.

    Every rank keeps what it wrote to its node's array again, privately (``added``):
    without a race the array (after the nodes' mean) ends at x_0 + (the sum of every
    rank's ``added``) / nodes; what it misses is what the races lost. On rank 0:
    ({name: that end}, {name: the array}); every rank must end with the same array.
    """
    shared = "x" if run.strategy == "hogwild" else "centre"
    ends = world.gather(names[shared], root=0)
    total = world.reduce(names["added"], op=MPI.SUM, root=0)
    nodes = world.size // int(run.args[0]) if run.args else 1
    if world.rank:
        return {}, {}
    if any(not np.array_equal(end, ends[0]) for end in ends):
        raise AssertionError(f"{run.case}: the ranks end with different {shared}")
    return {shared: reference.Gradients().start + total / nodes}, {shared: ends[0]}


def compare(run, names: dict, trained: dict, start: np.ndarray, mutant: bool) -> None:
    """Compare one run of a program with its reference; rank 0 prints the line."""
    expected, got = reference_of(run, names, trained)
    bitwise = all(np.array_equal(got[k], expected[k]) for k in expected)
    diff = max((float(np.abs(got[k] - expected[k]).max()) for k in expected), default=0.0)
    distance = max((float(np.linalg.norm(got[k] - expected[k])
                          / np.linalg.norm(expected[k] - start)) for k in expected), default=0.0)
    moved = max((float(np.abs(expected[k] - start).max()) for k in expected), default=0.0)
    numbers = world.gather((bitwise, diff, distance, moved, bool(expected)), root=0)
    if world.rank:
        return
    line = {"case": run.case, "mutant": mutant, "bitwise": all(n[0] for n in numbers),
            "max_diff": max(n[1] for n in numbers), "distance": max(n[2] for n in numbers),
            "moved": max(n[3] for n in numbers), "compared": sum(n[4] for n in numbers)}
    if run.strategy == "dbs" and run.check == "rules":
        line["sizes"] = sorted({entry[2] for entry in names["log"]})
    print("TEXTBOOK " + json.dumps(line), flush=True)


def main() -> None:
    directory = sys.argv[1]
    found = programs()
    start = reference.Gradients().start
    ran: dict[tuple, dict] = {}
    trained: dict[str, dict] = {}
    for run in RUNS:
        if run.ranks != world.size:
            continue
        source = found[run.program].source
        old, new = run.mutant
        if source.count(old) != 1:
            raise AssertionError(f"{run.case}: the mutant's text {old!r} is in "
                                 f"{run.program} {source.count(old)} times, not once")
        paths = (os.path.join(directory, run.program),
                 os.path.join(directory, f"mutant_{run.case}_{run.program}"))
        if world.rank == 0:
            for path, text in zip(paths, (source, source.replace(old, new))):
                with open(path, "w") as f:
                    f.write(text)
        world.Barrier()
        key = (run.program, run.args)
        if key not in ran:
            ran[key] = run_program(paths[0], run.args)
        compare(run, ran[key], trained, start, mutant=False)
        compare(run, run_program(paths[1], run.args), trained, start, mutant=True)


if __name__ == "__main__":
    main()
