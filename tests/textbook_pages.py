"""The textbook programs on the strategy pages: where they are and what each run must equal.

Every strategy page (``docs/NAME.md``) ends with "The textbook version": the algorithm as
a short program of NumPy and blocking mpi4py calls, in a fenced ``python`` block right
after the marker line ``<!-- textbook: FILE.py -->``, with the commands that run it
(``mpiexec -n N python FILE.py ARGS``) above it. This module finds them (no MPI here:
pytest's own process imports it) and lists the runs :mod:`tests.scripts.run_textbook`
makes of them, each with what it is compared with:

* ``production``: the strategy of minidp with the options that fix what the program
  fixes, driven through its public API on the same data (``textbook_reference.py``);
* ``rules``: the program's own run with several workers, first come first served,
  re-executed in one process in the order its server logged, from the replay's rules
  (``minidp/replay/rules.py``), the reference for an order that no rerun repeats;
* ``races``: a lock-free program with several ranks on one array, where no exact
  reference exists (docs/hogwild.md says why): the array must end where the writes the
  ranks made (each keeps them again, privately, in ``added``) take it, but for what the
  races lost, at most :data:`LOST` of the way.

Each run also names a *mutant*: one change to the program's update (old text, new
text) that its comparison must catch.
"""

from __future__ import annotations

import dataclasses
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ("sync", "hsgd", "hbsgd", "daso", "asgd", "softsync", "dbs", "hogwild", "easgd")
SECTION = "## The textbook version"
MARKER = re.compile(r"^<!-- textbook: (?P<name>textbook_\w+\.py) -->\n```python\n"
                    r"(?P<source>.*?)^```$", re.M | re.S)
COMMAND = re.compile(r"^mpiexec -n (?P<ranks>\d+) python (?P<name>textbook_\w+\.py)"
                     r"(?P<args>[^#\n]*)", re.M)
LINES = (20, 60)  # a program short enough to hold in one's head


@dataclasses.dataclass(frozen=True)
class Program:
    """One textbook program: its page, its file name and source, the commands shown."""

    page: str
    name: str
    source: str
    commands: tuple[tuple[int, tuple[str, ...]], ...]  # (ranks, arguments) per command


def section(page: str) -> str:
    """The text of ``page``'s textbook section ('' if it has none)."""
    with open(os.path.join(ROOT, "docs", f"{page}.md")) as f:
        text = f.read()
    start = text.find(SECTION)
    if start < 0:
        return ""
    end = text.find("\n## ", start + len(SECTION))
    return text[start:] if end < 0 else text[start:end]


def programs() -> dict[str, Program]:
    """Every textbook program of the strategy pages, by file name."""
    found: dict[str, Program] = {}
    for page in PAGES:
        text = section(page)
        commands = [(int(m["ranks"]), m["name"], tuple(m["args"].split()))
                    for m in COMMAND.finditer(text)]
        for match in MARKER.finditer(text):
            name = match["name"]
            if name in found:
                raise ValueError(f"docs/{page}.md: {name} is on docs/{found[name].page}.md too")
            found[name] = Program(page, name, match["source"], tuple(
                (ranks, args) for ranks, program, args in commands if program == name))
    return found


@dataclasses.dataclass(frozen=True)
class Run:
    """One run of a textbook program and what it must equal.

    Attributes:
        case: the run's id.
        program: the file name of the program.
        ranks: the world size (the job it runs in).
        args: its command-line arguments.
        check: ``production``, ``rules`` or ``races`` (see the module docstring).
        strategy: the minidp strategy it stands for.
        options: the strategy's options (``production``) or the program's constants
            the reference needs (``rules``).
        exact: True: bit for bit; False: within :data:`TOLERANCE` (the reason in
            ``why``); ``races`` runs are never exact.
        why: why the comparison is what it is.
        mutant: (old, new): a change to the update the comparison must catch.
    """

    case: str
    program: str
    ranks: int
    args: tuple[str, ...]
    check: str
    strategy: str
    options: dict
    exact: bool
    why: str
    mutant: tuple[str, str]

    @property
    def command(self) -> tuple[int, tuple[str, ...]]:
        """What the page shows for this run: (ranks, arguments)."""
        return self.ranks, self.args


TOLERANCE = 1e-12  # float64, where MPI chooses the order of a sum of more than two numbers
LOST = 0.25  # a lock-free run may lose at most this share of its motion to races
TWO_BY_TWO = ("2 nodes x 2: every sum adds two numbers (IEEE addition is commutative), "
              "in the order minidp's node-then-rail reduction adds them")
ONE_WORKER = "one worker: the order of the messages is fixed"
IN_ITS_ORDER = ("three workers, first come first served: the run re-executed in the order "
                "its server logged, from the replay's rules")

RUNS = (
    Run("sync", "textbook_sync.py", 4, (), "production", "sync",
        {"ranks_per_node": 2, "allreduce": "mpi", "steps": 6}, False,
        "MPI's Allreduce and minidp's (an Iallreduce) may add 4 numbers in different orders",
        ("x -= LR * g", "x -= 1.01 * LR * g")),
    Run("sync-hierarchical", "textbook_sync.py", 4, ("--hierarchical",), "production", "sync",
        {"ranks_per_node": 2, "allreduce": "hierarchical", "steps": 6}, True, TWO_BY_TWO,
        ("g /= size", "g /= size - 1")),
    Run("hsgd-gradients", "textbook_hsgd.py", 4, (), "production", "hsgd",
        {"ranks_per_node": 2, "steps": 6}, True, TWO_BY_TWO,
        ("    a /= size", "    a /= size + 1")),
    Run("hsgd-parameters", "textbook_hsgd.py", 4, ("parameters",), "production", "hsgd",
        {"ranks_per_node": 2, "steps": 6, "average": "parameters", "level1_period": 2,
         "level2_period": 4}, True, TWO_BY_TWO,
        ("elif t % LEVEL1 == 0:", "elif t % LEVEL1 == 1:")),
    Run("hbsgd", "textbook_hbsgd.py", 4, (), "production", "hbsgd",
        {"ranks_per_node": 2, "steps": 7, "k": 3}, True, TWO_BY_TWO,
        ("if t % K == 0:", "if t % K == 1:")),
    Run("daso", "textbook_daso.py", 4, (), "production", "daso",
        {"ranks_per_node": 2, "epochs": 2, "steps": 8, "warmup_epochs": 1,
         "cooldown_epochs": 0}, True, TWO_BY_TWO,
        ("x = (2 * S * x + total) / (2 * S + P)", "x = (S * x + total) / (S + P)")),
    Run("daso-rail", "textbook_daso.py", 4, (), "production", "daso",
        {"ranks_per_node": 2, "epochs": 2, "steps": 8, "warmup_epochs": 1,
         "cooldown_epochs": 0, "global_sync": "rail"}, True, TWO_BY_TWO,
        ("elif b % B == S:", "elif b % B == S + 1:")),
    Run("asgd", "textbook_asgd.py", 2, (), "production", "asgd", {"steps": 6}, True,
        ONE_WORKER, ("x -= LR * v", "x -= LR * v * 1.01")),
    Run("amsgd", "textbook_asgd.py", 2, ("--amsgd",), "production", "amsgd",
        {"steps": 6, "momentum": 0.9}, True, ONE_WORKER,
        ("v = MOMENTUM * v + g", "v = MOMENTUM * v + g * (1 - MOMENTUM)")),
    Run("asgd-workers", "textbook_asgd.py", 4, (), "rules", "asgd", {"steps": 6}, True,
        IN_ITS_ORDER, ("x -= LR * v", "x -= LR * v * 1.01")),
    Run("amsgd-workers", "textbook_asgd.py", 4, ("--amsgd",), "rules", "amsgd",
        {"steps": 6, "momentum": 0.9}, True, IN_ITS_ORDER,
        ("v = MOMENTUM * v + g", "v = MOMENTUM * v + g * (1 - MOMENTUM)")),
    Run("softsync", "textbook_softsync.py", 2, (), "production", "softsync", {"steps": 6},
        True, ONE_WORKER, ("x -= LR / max(", "x -= 1.01 * LR / max(")),
    Run("softsync-workers", "textbook_softsync.py", 4, (), "rules", "softsync",
        {"steps": 6, "n": 1}, True, IN_ITS_ORDER,
        ("* (total / c)", "* (total / size)")),
    Run("dbs", "textbook_dbs.py", 2, (), "production", "dbs", {"steps": 6}, True, ONE_WORKER,
        ("x -= LR * (n / BATCH * g)", "x -= LR * (n / BATCH * g) * 1.01")),
    Run("dbs-workers", "textbook_dbs.py", 4, (), "rules", "dbs", {"steps": 6}, True,
        IN_ITS_ORDER, ("x -= LR * (n / BATCH * g)", "x -= LR * (n / BATCH * g) * 1.01")),
    Run("hogwild", "textbook_hogwild.py", 2, ("1",), "production", "hogwild",
        {"ranks_per_node": 1, "steps": 6}, True,
        "2 nodes of one rank: no race; each node is plain SGD until the nodes' mean",
        ("shared -= LR * g", "shared -= 1.01 * LR * g")),
    Run("hogwild-workers", "textbook_hogwild.py", 4, (), "races", "hogwild", {}, False,
        "4 ranks on one array without a lock: the interleaving and the lost writes differ "
        "from run to run", ("shared -= LR * g", "shared -= 0.5 * LR * g")),
    Run("easgd-rr", "textbook_easgd.py", 4, ("rr",), "production", "easgd-rr",
        {"steps": 6, "tau": 2}, True, "the master takes the workers in rank order",
        ("centre += ALPHA * (xi - centre)", "centre += 0.5 * ALPHA * (xi - centre)")),
    Run("easgd-async", "textbook_easgd.py", 2, ("fcfs",), "production", "easgd-async",
        {"steps": 6, "tau": 2}, True, ONE_WORKER,
        ("d = ALPHA * (x - c)", "d = ALPHA * (c - x)")),
    Run("measgd-async", "textbook_easgd.py", 2, ("fcfs", "0.9"), "production", "measgd-async",
        {"steps": 6, "tau": 2, "delta": 0.9}, True, ONE_WORKER,
        ("y = x + v", "y = x + 0.5 * v")),
    Run("easgd-async-workers", "textbook_easgd.py", 4, ("fcfs",), "rules", "easgd-async",
        {"steps": 6, "tau": 2}, True, IN_ITS_ORDER,
        ("centre += ALPHA * (xi - centre)", "centre += 0.5 * ALPHA * (xi - centre)")),
    Run("measgd-async-workers", "textbook_easgd.py", 4, ("fcfs", "0.9"), "rules",
        "measgd-async", {"steps": 6, "tau": 2, "delta": 0.9}, True, IN_ITS_ORDER,
        ("v -= LR * g", "v -= 0.5 * LR * g")),
    Run("easgd-hogwild", "textbook_easgd_hogwild.py", 2, ("1",), "production", "easgd-hogwild",
        {"ranks_per_node": 1, "steps": 6, "tau": 2}, True,
        "2 nodes of one rank: no race; each node is EASGD with one worker until the "
        "centres' mean", ("centre += d", "centre += 0.5 * d")),
    Run("easgd-hogwild-workers", "textbook_easgd_hogwild.py", 4, (), "races", "easgd-hogwild",
        {}, False, "4 ranks on one centre without a lock: the interleaving and the lost "
        "writes differ from run to run", ("centre += d", "centre += 0.5 * d")),
    Run("easgd-sync", "textbook_easgd_sync.py", 4, (), "production", "easgd-sync",
        {"steps": 6, "tau": 2}, False,
        "MPI's Reduce and minidp's binomial tree may add 4 numbers in different orders",
        ("centre += BETA * (total / size - centre)",
         "centre += BETA * (total / (size + 1) - centre)")),
    Run("easgd-sync-allreduce", "textbook_easgd_sync.py", 4, (), "production", "easgd-sync",
        {"steps": 6, "tau": 2, "mode": "allreduce"}, False,
        "MPI's Reduce and minidp's recursive doubling may add 4 numbers in different orders",
        ("d = ALPHA * (x - centre)", "d = 0.5 * ALPHA * (x - centre)")),
)
