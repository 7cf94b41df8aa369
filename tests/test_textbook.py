"""Every strategy page's textbook program runs, and equals what it says it equals.

The programs are taken from the pages (``tests/textbook_pages.py``), so a page that
drifts from the code fails here. Two jobs (4 ranks, then 2) run every command shown on
the pages and a copy of each with one change to its update
(``tests/scripts/run_textbook.py``); each run is compared with its reference
(``tests/textbook_reference.py``): minidp's strategy on the same samples, the
first-come-first-served run's own order re-executed from the replay's rules, or, for
the lock-free programs, where the ranks' own writes take the shared array.
"""

import json
import os
import re

import pytest
from spmd import run_spmd
from textbook_pages import LINES, LOST, PAGES, RUNS, TOLERANCE, programs

# `make test` runs the module on one pytest-xdist worker: its fixture is shared.
pytestmark = pytest.mark.xdist_group("textbook")

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "run_textbook.py")
# What a textbook program may take from minidp: the model and the autograd for its gradient.
MINIDP_NAMES = {"Tensor", "layers", "functional as F"}
MACHINERY = ("minidp.comm", "minidp.strategies", "minidp.run", "guard", "SharedArray")
NON_BLOCKING = re.compile(r"\.(I[a-z]+|Test\w*|Wait\w*)\(")  # Isend, Iallreduce, ... waits
# The lock-free programs: one array in the node's shared memory is their algorithm.
SHARED_MEMORY = {"textbook_hogwild.py", "textbook_easgd_hogwild.py"}


def test_every_strategy_page_has_its_textbook_program():
    found = programs()
    assert {p.page for p in found.values()} == set(PAGES)
    for program in found.values():
        lines = len(program.source.splitlines())
        assert LINES[0] <= lines <= LINES[1], f"{program.name}: {lines} lines"
        imported = set()
        for names in re.findall(r"^from minidp\S* import (.+)$", program.source, re.M):
            imported |= {n.strip() for n in names.split(",")}
        assert imported <= MINIDP_NAMES, f"{program.name} imports {imported - MINIDP_NAMES}"
        assert not any(word in program.source for word in MACHINERY), program.name
        assert not NON_BLOCKING.search(program.source), program.name
        assert ("Allocate_shared" in program.source) == (program.name in SHARED_MEMORY)


def test_the_pages_show_exactly_the_commands_the_test_runs():
    found = programs()
    for name, program in found.items():
        shown = set(program.commands)
        tested = {run.command for run in RUNS if run.program == name}
        assert shown == tested, f"docs/{program.page}.md, {name}: shown {shown}, run {tested}"
    assert {run.program for run in RUNS} == set(found)


def test_every_mutant_changes_its_program_once():
    found = programs()
    for run in RUNS:
        old, new = run.mutant
        assert old != new and found[run.program].source.count(old) == 1, run.case


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    """{(case, mutant): the driver's line} from one job per world size."""
    from minidp.kernels import ensure_compiled

    ensure_compiled()  # in a fresh clone: compiled here, before the timed jobs
    lines = {}
    for ranks in sorted({run.ranks for run in RUNS}, reverse=True):
        directory = tmp_path_factory.mktemp(f"textbook{ranks}")
        launch = run_spmd([DRIVER, str(directory)], ranks, timeout=300,
                          env={"MINIDP_NUM_THREADS": "1"})
        assert launch.returncode == 0 and not launch.killed, launch.output[-6000:]
        for found in re.findall(r"^TEXTBOOK (\{.*\})$", launch.output, re.M):
            line = json.loads(found)
            lines[line["case"], line["mutant"]] = line
    return lines


def passes(run, line) -> bool:
    """Whether a run's comparison holds: bit for bit, to the tolerance, or (races) what
    was lost to them is at most LOST of the motion."""
    if run.check == "races":
        return line["distance"] <= LOST
    return line["bitwise"] if run.exact else line["max_diff"] <= TOLERANCE


@pytest.mark.parametrize("run", RUNS, ids=[run.case for run in RUNS])
def test_the_textbook_program_equals_its_reference(compared, run):
    line = compared[run.case, False]
    assert line["compared"] >= 1 and line["moved"] > 1e-3, line  # something was trained
    assert passes(run, line), f"{run.case} ({run.why}): {line}"


@pytest.mark.parametrize("run", RUNS, ids=[run.case for run in RUNS])
def test_a_changed_update_fails_the_comparison(compared, run):
    line = compared[run.case, True]
    assert not passes(run, line), f"{run.case}: {run.mutant[0]!r} -> {run.mutant[1]!r} " \
        f"still passes: {line}"
