"""Every "Read the code" hop of the docs names a function that exists, where it says.

Each strategy page (``docs/NAME.md``) has a section ``## Read the code``: numbered hops
of one step on the default path, each ``N. `minidp/path.py:function`: what happens
there`` (or ``Class.method``), one list per strategy id the page covers, then the
defaults that choose that path. ``docs/design.md`` walks one batch the same way (its
"The walk of one batch", subsection ``### Read the code``). Here every hop is parsed,
its module imported, its name looked up, and the function (or method) must be defined
in that very file: a hop to something renamed, moved or inherited from elsewhere
fails, naming the page and line.
"""

import importlib
import inspect
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGES = ("sync", "hsgd", "hbsgd", "daso", "asgd", "softsync", "dbs", "hogwild", "easgd")
# A hop: the number, the file and the name in backticks, a colon, then what happens there.
HOP = re.compile(r"^(\d+)\. `(minidp/[\w/]+\.py):([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)?)`: (.+)$")
NUMBERED = re.compile(r"^\d+\. ")
MIN_WORDS = 5  # "one line on what happens there": more than a name


def section(text: str, heading: str) -> list[tuple[int, str]]:
    """(line number, line) of the section under ``heading`` (its level), to the next one."""
    lines = text.splitlines()
    level = heading.split()[0]
    start = next((i for i, line in enumerate(lines) if line.startswith(heading)), None)
    assert start is not None, f"no section {heading!r}"
    found = []
    for i in range(start + 1, len(lines)):
        line = lines[i]
        if line.startswith("#") and len(line.split()[0]) <= len(level):
            break
        found.append((i + 1, line))
    return found


def hop_lists(lines: list[tuple[int, str]]) -> list[list[tuple[int, str, str, str]]]:
    """The section's numbered lists: each a list of (line, path, name, what happens).

    A hop's text may go on over indented lines. A numbered line that is not a hop's
    shape is an error; the numbers of a list count 1, 2, 3, ...
    """
    lists: list[list[tuple[int, str, str, str]]] = []
    for number, line in lines:
        if NUMBERED.match(line):
            match = HOP.match(line)
            assert match, f"line {number}: a hop is N. `minidp/path.py:name`: what happens " \
                          f"there; got {line!r}"
            index, path, name, what = match.groups()
            if index == "1":
                lists.append([])
            assert lists and int(index) == len(lists[-1]) + 1, \
                f"line {number}: hop {index} does not follow hop {len(lists[-1]) if lists else 0}"
            lists[-1].append((number, path, name, what))
        elif lists and line.startswith("   ") and line.strip():
            n, path, name, what = lists[-1][-1]
            lists[-1][-1] = (n, path, name, f"{what} {line.strip()}")
    return lists


def resolve(path: str, name: str) -> object:
    """The function or method ``name`` of the module at ``path``, defined in that file."""
    module = importlib.import_module(path[:-3].replace("/", "."))
    target: object = module
    for part in name.split("."):
        assert hasattr(target, part), f"{path} has no {name} ({part!r} is missing)"
        target = getattr(target, part)
    assert inspect.isfunction(target), f"{path}:{name} is not a function or method"
    defined = os.path.relpath(inspect.getsourcefile(target), ROOT)
    assert defined == path, f"{path}:{name} is defined in {defined}, not in {path}"
    if "." in name:  # a method: written in that class's body, not inherited
        cls_name, method = name.split(".")
        assert target.__qualname__ == name, \
            f"{path}:{name} is {target.__qualname__}: {method} is inherited, not {cls_name}'s"
    return target


def checked(page: str, heading: str) -> list[list[tuple[int, str, str, str]]]:
    """The page's hop lists under ``heading``, each hop's shape checked and resolved."""
    with open(os.path.join(ROOT, "docs", f"{page}.md")) as f:
        lines = section(f.read(), heading)
    lists = hop_lists(lines)
    assert lists, f"docs/{page}.md: no hops under {heading!r}"
    for hops in lists:
        assert 3 <= len(hops) <= 6, f"docs/{page}.md line {hops[0][0]}: {len(hops)} hops, " \
                                    "allowed 3 to 6"
        for number, path, name, what in hops:
            assert len(what.split()) >= MIN_WORDS, \
                f"docs/{page}.md line {number}: say what happens at {name}: {what!r}"
            resolve(path, name)
    return lists


@pytest.mark.parametrize("page", PAGES)
def test_every_strategy_page_reads_the_code_hop_by_hop(page):
    lists = checked(page, "## Read the code")
    with open(os.path.join(ROOT, "docs", f"{page}.md")) as f:
        text = "\n".join(line for _, line in section(f.read(), "## Read the code"))
    assert "**The defaults that choose" in text, \
        f"docs/{page}.md: say which defaults choose the path the hops follow"
    for hops in lists:  # a step's path ends at the update, or hands it to the optimizer
        assert any(path.startswith("minidp/optim/") or "update" in what
                   for _, path, _, what in hops), f"docs/{page}.md: no update on the path"


def test_the_design_page_walks_one_batch_from_backward_to_the_update():
    lists = checked("design", "### Read the code")
    assert len(lists) == 1
    hops = lists[0]
    assert (hops[0][1], hops[0][2]) == ("minidp/autograd/tensor.py", "Tensor.backward")
    assert hops[-1][1].startswith("minidp/optim/")


def test_each_strategy_id_is_read_on_a_page():
    from minidp.strategies import names

    read = {}
    for page in PAGES:
        with open(os.path.join(ROOT, "docs", f"{page}.md")) as f:
            read[page] = "\n".join(line for _, line in section(f.read(), "## Read the code"))
    unread = [name for name in names()
              if name not in read and not any(f"`{name}`" in text for text in read.values())]
    assert unread == [], f"strategy ids no page's Read the code section follows: {unread}"


def test_a_hop_to_something_that_does_not_exist_fails(tmp_path):
    with pytest.raises(AssertionError, match="has no SyncSGD.stepp"):
        resolve("minidp/strategies/sync.py", "SyncSGD.stepp")
    with pytest.raises(AssertionError, match="defined in minidp/strategies/ps_base.py"):
        resolve("minidp/strategies/asgd.py", "AsyncSGD.step")  # inherited from the base
    with pytest.raises(ModuleNotFoundError):
        resolve("minidp/strategies/nowhere.py", "step")
    lines = list(enumerate(["1. `minidp/comm/levels.py:world_mean`: the world's mean here",
                            "2. minidp/optim/sgd.py SGD.step without its backticks"], 1))
    with pytest.raises(AssertionError, match="a hop is N"):
        hop_lists(lines)
    assert hop_lists(lines[:1]) == [[(1, "minidp/comm/levels.py", "world_mean",
                                      "the world's mean here")]]
