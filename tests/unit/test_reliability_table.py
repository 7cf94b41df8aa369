"""docs/reliability.md's table of guarantees: every test it names exists, every link lands.

The table is the project's list of promises, each with the tests that check it. A test
renamed, moved or deleted would leave a promise that nothing checks while the page still
says something does; so every reference in the "checked by" column is resolved here:

* ``tests/PATH.py::NAME``: the file exists and defines a test function ``NAME`` at its top
  level (read with :mod:`ast`, never imported: the SPMD files import ``mpi4py.MPI``), or
  a test class ``NAME``, or ``CLASS::NAME`` a test method of that class;
* ``make TARGET``: the Makefile has a rule for ``TARGET``.

Nothing else may stand in that column as a test (a bare file name would hide which test
checks the promise). Each promise links to the section that explains it; the link's
anchor must be a heading of that page (GitHub's anchors: lower case, punctuation but
``-`` and ``_`` dropped, spaces as ``-``).
"""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(ROOT, "docs", "reliability.md")
TEST = re.compile(r"`(tests/[\w/]+\.py)((?:::\w+)+)`")
MAKE = re.compile(r"`make ([\w-]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]*)\)")
GROUP = re.compile(r"\*\*[^*]+\*\*")  # a row that only names the next rows' topic
MIN_ROWS = 40  # the table holds more; fewer means the parser lost it


def table(text: str) -> list[list[str]]:
    """The cells of every row of the first table under "## Guarantees", header excluded."""
    lines = text.split("## Guarantees\n", 1)[1].splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2:]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def split_cells(row: list[str]) -> tuple[str, str, str]:
    """(guarantee, how, checked by): a row has three cells (no cell holds a '|')."""
    assert len(row) == 3, f"a row of {len(row)} cells, allowed: 3: {row}"
    return row[0], row[1], row[2]


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: str) -> set[str]:
    """The anchors of every heading of ``page`` (outside code blocks)."""
    found, fenced = set(), False
    with open(page) as f:
        for line in f:
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and line.startswith("#"):
                found.add(slug(line.lstrip("#")))
    return found


def defines(path: str, names: list[str]) -> bool:
    """Whether the test module at ``path`` defines ``names`` (a function, or class::method)."""
    with open(path) as f:
        scope = ast.parse(f.read(), path).body
    for k, name in enumerate(names):
        found = [node for node in scope if isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name]
        if not found or not name.startswith(("test_", "Test")):
            return False
        if k + 1 < len(names):
            if not isinstance(found[0], ast.ClassDef):
                return False
            scope = found[0].body
    return True


def make_targets() -> set[str]:
    with open(os.path.join(ROOT, "Makefile")) as f:
        return {m.group(1) for m in re.finditer(r"^([\w-]+):", f.read(), re.MULTILINE)}


def dangling(rows: list[list[str]]) -> list[str]:
    """Every reference of the table that does not resolve, in words."""
    bad, targets, pages = [], make_targets(), {}
    for row in rows:
        promise, how, checked = split_cells(row)
        if GROUP.fullmatch(promise) and not how and not checked:
            continue
        if not TEST.search(checked) and not MAKE.search(checked):
            bad.append(f"{promise}: no test named")
        for path, names in TEST.findall(checked):
            full = os.path.join(ROOT, path)
            if not os.path.isfile(full) or not defines(full, names.split("::")[1:]):
                bad.append(f"{promise}: {path}{names} does not exist")
        for target in MAKE.findall(checked):
            if target not in targets:
                bad.append(f"{promise}: make {target} is no Makefile target")
        rest = MAKE.sub("", TEST.sub("", checked))
        if "tests/" in rest and (TEST.search(checked) or MAKE.search(checked)):
            bad.append(f"{promise}: a test without its name (tests/FILE.py::TEST): {rest}")
        links = LINK.findall(promise)
        if not links:
            bad.append(f"{promise}: no link to the section that explains it")
        for link in links:
            page, _, anchor = link.partition("#")
            page = os.path.join(ROOT, "docs", page) if page else PAGE
            if not os.path.isfile(page):
                bad.append(f"{promise}: {link}: no such page")
            elif anchor and anchor not in pages.setdefault(page, anchors(page)):
                bad.append(f"{promise}: {link}: no such heading")
    return bad


def test_every_guarantee_names_tests_that_exist_and_a_section_that_explains_it():
    with open(PAGE) as f:
        rows = table(f.read())
    assert len(rows) >= MIN_ROWS, f"the table parsed into {len(rows)} rows"
    assert not dangling(rows)


@pytest.mark.parametrize("cell, why", [
    ("`tests/unit/test_rundir.py::test_no_such_test`", "does not exist"),
    ("`tests/unit/no_such_file.py::test_numbered_directories_and_latest`", "does not exist"),
    ("`tests/unit/test_reliability_table.py::table`", "does not exist"),  # not a test
    ("`tests/unit/test_rundir.py::test_numbered_directories_and_latest::test_x`",
     "does not exist"),  # a function has no methods
    ("`make no-such-target`", "no Makefile target"),
    ("`tests/unit/test_rundir.py`", "no test named"),
    ("`tests/unit/test_rundir.py::test_numbered_directories_and_latest`, "
     "`tests/unit/test_rundir.py`", "without its name"),
])
def test_a_dangling_reference_is_found(cell, why):
    found = dangling([["[a promise](#known-limits)", "how", cell]])
    assert len(found) == 1 and why in found[0], found


@pytest.mark.parametrize("link, why", [
    ("#no-such-section", "no such heading"),
    ("no-such-page.md", "no such page"),
    ("mdp-format.md#no-such-section", "no such heading"),
])
def test_a_link_that_lands_nowhere_is_found(link, why):
    found = dangling([[f"[a promise]({link})", "how", "`make test`"]])
    assert len(found) == 1 and why in found[0], found


def test_references_that_resolve_and_group_rows_pass():
    rows = [["**A topic**", "", ""],
            ["[a promise](#known-limits)", "how",
             "`tests/unit/test_rundir.py::test_numbered_directories_and_latest`, `make fuzz`"],
            ["[another](mdp-format.md#the-same-files-for-the-whole-run)", "how",
             "`tests/mpi/test_readers.py::test_collective_checksum_verification` (4 ranks)"]]
    assert dangling(rows) == []


def test_headings_become_githubs_anchors():
    assert slug(" Timeouts: nothing hangs\n") == "timeouts-nothing-hangs"
    assert slug("What `make test` checks on 2 hosts x 2 ranks (`tests/test_hosts.py`)") == \
        "what-make-test-checks-on-2-hosts-x-2-ranks-teststest_hostspy"
