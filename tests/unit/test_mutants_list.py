"""The list of ``make mutants`` fits the code: every mutant's text is there exactly once.

``make mutants`` (tests/mutants.py) takes minutes; this check is instant and runs in
``make test``, so a change that moves a mutated line is noticed at once, not at the next
mutation run.
"""

import os
import re

import mutants
import pytest


def test_every_mutant_applies_once_and_names_tests_that_exist():
    listed = mutants.load()  # raises, naming each mutant whose text is not there once
    counted = [m for m in listed if not m.equivalent]
    assert len(counted) >= 30
    for m in counted:
        for test in m.tests:
            node = re.sub(r"^mpi\d+:", "", test)
            path, _, name = node.partition("::")
            name = name.split("[", 1)[0]  # a parametrized case: its function is named
            assert os.path.exists(os.path.join(mutants.ROOT, path)), (m.id, path)
            with open(os.path.join(mutants.ROOT, path)) as f:
                assert re.search(rf"^def {re.escape(name)}\(", f.read(), re.M), (m.id, test)
    for m in listed:
        if m.equivalent:
            assert len(m.equivalent) > 20, f"{m.id}: say why it is equivalent"


def test_a_text_that_is_not_there_once_is_refused(tmp_path):
    listing = tmp_path / "mutants.toml"
    listing.write_text('[[mutant]]\nid = "x"\nfile = "minidp/strategies/sync.py"\n'
                       'find = "no such text"\nreplace = "y"\ntests = []\nwhy = "w"\n')
    with pytest.raises(ValueError, match="x: minidp/strategies/sync.py holds its text 0 times"):
        mutants.load(str(listing))
