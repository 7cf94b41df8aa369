"""docs/configuration.md is the generator's output: every flag, option and variable."""

import argparse
import glob
import os
import re

from minidp.run import config_page
from minidp.run.flags import build_parser
from minidp.strategies import STRATEGIES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAGE = os.path.join(ROOT, "docs", "configuration.md")


def test_the_page_is_the_generators_output():
    with open(PAGE) as f:
        assert f.read() == config_page.page(), \
            "docs/configuration.md is stale: python -m minidp.run.config_page > " \
            "docs/configuration.md"


def test_every_flag_and_strategy_option_is_on_the_page():
    text = config_page.page()
    parser = build_parser(argparse.ArgumentParser())
    flags = [s for a in parser._actions for s in a.option_strings[:1] if s != "-h"]
    assert len(flags) > 30
    for flag in flags:
        assert f"| `{flag}" in text, flag
    for name, cls in STRATEGIES.items():
        for option in cls.options:
            assert f"`--set {name}.{option}=" in text, (name, option)
        assert f"| `{name}` | " in text  # its default rates


def test_every_minidp_variable_the_package_reads_is_described():
    read = set()
    for path in glob.glob(os.path.join(ROOT, "minidp", "**", "*.py"), recursive=True):
        with open(path) as f:
            read |= set(re.findall(r"\"(MINIDP_[A-Z_]+)\"", f.read()))
    described = {n for names in config_page.ENVIRONMENT for n in names.split(", ")}
    assert {"MINIDP_NUM_THREADS", "MINIDP_PROGRESS", "MINIDP_COMM_TIMEOUT"} <= read
    assert read == {n for n in described if n.startswith("MINIDP_")}
