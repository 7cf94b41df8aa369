"""A user who sets a flag the strategy does not use is told, in one line (issue 30).

The CLI's default --momentum is 0.9 and most strategies of the asynchronous and elastic
families apply no momentum: the line names what was given and ignored, never a default.
"""

import argparse

import pytest

from minidp import strategies
from minidp.run.config import TrainConfig
from minidp.run.flags import build_parser, from_args, given_settings


def notice(*argv):
    config = from_args(build_parser(argparse.ArgumentParser()).parse_args(list(argv)))
    cls = strategies.strategy_class(config.strategy)
    return cls.ignored_notice(config.options, given_settings(config))


@pytest.mark.parametrize("argv,expected", [
    (["--strategy", "asgd", "--momentum", "0.9"],
     "note: --strategy asgd ignores --momentum 0.9; it applies plain SGD at the server "
     "(amsgd keeps momentum there)"),
    (["--strategy", "easgd-rr", "--momentum", "0.5", "--nesterov"],
     "note: --strategy easgd-rr ignores --momentum 0.5 and --nesterov; its workers apply "
     "plain SGD (measgd-async has momentum: measgd-async.delta)"),
    (["--strategy", "softsync", "--momentum", "0.5"],
     "note: --strategy softsync ignores --momentum 0.5; it applies plain SGD at the server, "
     "as the papers; --set softsync.server_momentum=true keeps --momentum there"),
    (["--strategy", "dbs", "--momentum", "0.9"],
     "note: --strategy dbs ignores --momentum 0.9; update=each applies plain SGD at the "
     "server; --set dbs.update=round uses --momentum"),
    (["--strategy", "asgd"], None),  # the default 0.9 was not the user's choice
    (["--strategy", "asgd", "--momentum", "0"], None),  # asks for nothing missing
    (["--strategy", "amsgd", "--momentum", "0.9"], None),
    (["--strategy", "softsync", "--momentum", "0.9", "--set",
      "softsync.server_momentum=true"], None),
    (["--strategy", "dbs", "--momentum", "0.9", "--set", "dbs.update=round"], None),
    (["--strategy", "sync", "--momentum", "0.9"], None),
])
def test_only_flags_given_and_ignored_are_named(argv, expected):
    assert notice(*argv) == expected


def test_a_config_built_in_code_counts_what_differs_from_the_defaults():
    assert given_settings(TrainConfig(strategy="asgd", momentum=0.5))["momentum"] == 0.5
    assert "momentum" not in given_settings(TrainConfig(strategy="asgd"))
