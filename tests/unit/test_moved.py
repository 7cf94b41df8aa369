"""Old import paths keep working and say where the module (or the name) went."""

import importlib
import sys

import pytest


@pytest.mark.parametrize("old, new, name", [
    ("minidp.strategies.easgd", "minidp.strategies.easgd_async", "ElasticAsync"),
    ("minidp.strategies.easgd", "minidp.strategies.easgd_hogwild", "ElasticHogwild"),
    ("minidp.strategies.easgd", "minidp.strategies.easgd_base", "ElasticServer"),
    ("minidp.strategies.measgd", "minidp.strategies.measgd_async", "MomentumElasticAsync"),
    ("minidp.strategies.ps", "minidp.strategies.ps_base", "ParameterServer"),
    ("minidp.train", "minidp.run.trainer", "Trainer"),
    ("minidp.comm.peers", "minidp.comm.p2p_wait", "wait_peer"),
])
def test_a_moved_module_imports_under_its_old_name_with_a_warning(old, new, name):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to .*{new}"):
        module = importlib.import_module(old)
    assert getattr(module, name) is getattr(importlib.import_module(new), name)


def test_a_name_moved_out_of_a_module_is_found_with_a_warning():
    from minidp.optim import lars, sgd

    with pytest.warns(DeprecationWarning, match=r"minidp.optim.sgd.LARS moved to "
                                                r"minidp.optim.lars.LARS"):
        assert sgd.LARS is lars.LARS
    with pytest.raises(AttributeError, match="'minidp.optim.sgd' has no attribute 'Adam'"):
        sgd.Adam  # noqa: B018 (the attribute access is the test)


def test_a_module_that_never_existed_is_still_an_import_error():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("minidp.strategies.no_such_strategy")
