"""A strategy's facts live on its class: rates, resume rules, the simulator's costs.

The run, the checkpoint checks and the simulator ask the class (``default_rates``,
``any_world_size``, ``fixed_epochs``, ``simulate.predict.COSTS``) instead of comparing
the strategy's name; ``tests/unit/test_layout.py`` checks that no id is written as a
string outside ``strategies/`` and ``replay/``. Here each fact gives what the rules
say, written out below apart from the classes.
"""

import argparse
import dataclasses

import pytest

from minidp.run import checkpoint
from minidp.run.config import STRATEGY_RATES, TrainConfig
from minidp.run.errors import UsageError
from minidp.simulate import predict, validate
from minidp.strategies import DASO, STRATEGIES, SyncSGD, names

# The defaults as docs/configuration.md has listed them since issue 36: momentum SGD for
# the synchronous family; plain SGD where the update is a server's or an elastic worker's.
RATES = {"sync": (0.02, 0.9), "hsgd": (0.02, 0.9), "hbsgd": (0.02, 0.9),
         "daso": (0.02, 0.9), "asgd": (0.02, 0.0), "amsgd": (0.02, 0.7),
         "softsync": (0.1, 0.0), "dbs": (0.02, 0.0), "hogwild": (0.05, 0.0),
         "easgd-rr": (0.1, 0.0), "easgd-async": (0.1, 0.0), "easgd-hogwild": (0.1, 0.0),
         "easgd-sync": (0.1, 0.0), "measgd-async": (0.02, 0.0)}


def test_every_class_states_its_own_default_rates():
    assert {name: cls.default_rates for name, cls in STRATEGIES.items()} == RATES
    inherited = [name for name, cls in STRATEGIES.items() if "default_rates" not in vars(cls)]
    assert inherited == [], "each id says its own (lr, momentum), with why, at its class"
    assert STRATEGY_RATES == RATES
    for name, (lr, momentum) in RATES.items():
        config = TrainConfig(strategy=name).check()
        assert (config.lr, config.momentum) == (lr, momentum)
    assert TrainConfig().strategy == SyncSGD.name == "sync"


def resumable(name, **now):
    saved = dataclasses.asdict(TrainConfig(strategy=name, batch_size=16, epochs=4).check())
    return {"epoch": 2, "world_size": 2, "config": saved}, dict(saved, **now)


@pytest.mark.parametrize("name", names())
def test_only_a_strategy_whose_replicas_agree_resumes_on_another_world_size(name):
    meta, now = resumable(name)
    if name == "sync":  # every replica holds the same state after each step
        checkpoint.check_resumable(meta, now, 3, "ck")
        return
    with pytest.raises(UsageError) as refused:
        checkpoint.check_resumable(meta, now, 3, "ck")
    assert str(refused.value) == (
        f"--resume: cannot continue checkpoint 'ck': world size: checkpoint 2 ranks, now 3; "
        f"strategy {name!r} keeps a different state on every rank, so it resumes only on 2 "
        "ranks (allowed on any number: sync)")


@pytest.mark.parametrize("name", names())
def test_only_daso_with_a_cool_down_keeps_its_epochs_on_resume(name):
    meta, now = resumable(name, epochs=6)
    if name != "daso":
        checkpoint.check_resumable(meta, now, 2, "ck")
        return
    with pytest.raises(UsageError) as refused:
        checkpoint.check_resumable(meta, now, 2, "ck")
    assert str(refused.value) == (
        "--resume: cannot continue checkpoint 'ck': --epochs: checkpoint 4, now 6, but daso "
        "places its cool-down epochs at the end of the run, so it cannot change on resume")
    options = dict(now["options"], cooldown_epochs=0)
    meta["config"]["options"] = options
    checkpoint.check_resumable(meta, dict(now, options=options), 2, "ck")  # nothing at the end
    assert DASO.fixed_epochs({"cooldown_epochs": 0}) is None


def test_the_simulator_costs_six_strategies_by_class():
    assert predict.MODELLED == ("sync", "hsgd", "hbsgd", "daso", "easgd-rr", "easgd-sync")
    assert predict.DEFAULT == ("sync", "hsgd", "hbsgd", "daso")
    assert all(STRATEGIES[cls.name] is cls for cls in predict.COSTS)
    with pytest.raises(ValueError, match=r"--strategy: got 'asgd', allowed: sync, hsgd, hbsgd, "
                                         r"daso, easgd-rr, easgd-sync; the parameter-server"):
        predict.parse_strategies("sync,asgd", [])


def validation(**given):
    fields = dict(set=[], real_nodes=False, ranks_per_node=2, model="mlp", dataset="synthetic",
                  epochs=3, batch_size=8, dtype="float64", net_latency_us=0.0,
                  net_bandwidth_gbps=0.0, data_dir="data", samples=None, allreduce="ring")
    return argparse.Namespace(**dict(fields, **given))


def test_a_validation_run_takes_its_strategys_flags():
    args = validation(set=["daso.cooldown_epochs=2", "hsgd.average=parameters"])
    # DASO cycles between one warm-up epoch and its cool-down unless --set says otherwise
    assert validate.option_sets(args, "daso") == ["daso.cooldown_epochs=2",
                                                  "daso.warmup_epochs=1"]
    assert validate.option_sets(args, "hsgd") == ["hsgd.average=parameters"]
    assert validate.option_sets(validation(), "easgd-sync") == []
    flags = {name: validate.train_flags(args, name) for name in predict.MODELLED}
    with_allreduce = [name for name, f in flags.items() if "--allreduce" in f]
    assert with_allreduce == ["sync"]  # sync's allreduce is --allreduce; the others name theirs
    assert flags["sync"][flags["sync"].index("--allreduce") + 1] == "ring"


def test_a_daso_prediction_is_compared_with_the_epochs_of_its_phase():
    epoch = predict.Epoch("daso", "blocking (0,0,0)", 10, 1.0, 1.0, "blocking")
    options = {"warmup_epochs": 1, "cooldown_epochs": 1}
    assert validate._phase_epochs(epoch, 5, options) == [4]  # 0 and 4 block; the first is out
    cycling = dataclasses.replace(epoch, setting="cycling (4,1,1)", phase="cycling")
    assert validate._phase_epochs(cycling, 5, options) == [1, 2, 3]  # epoch 0 is not one
    sync = predict.Epoch("sync", "mpi", 10, 1.0, 1.0)
    assert validate._phase_epochs(sync, 3, {}) == [1, 2]
