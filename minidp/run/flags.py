"""The ``train`` command line and TOML files, merged into a checked :class:`TrainConfig`.

Precedence: defaults < ``--config FILE`` < flags given on the command line. In the
TOML file, top-level keys are the flag names (``batch_size`` or ``batch-size``) and
a table named after a strategy holds its options::

    strategy = "daso"
    epochs = 5
    [daso]
    max_global_skips = 4

``--set daso.max_global_skips=4`` does the same from the command line. The values are
checked by :meth:`TrainConfig.check` (:mod:`minidp.run.config`), whatever their source.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import stat
import tomllib
from typing import Any

from minidp.comm import ALLREDUCE_ALGORITHMS
from minidp.io.datasets import DATASETS
from minidp.io.mdp import file_kind
from minidp.layers import MODELS
from minidp.run import faults
from minidp.run.config import BATCH_SIZE, FIELDS, TrainConfig, check_type, flag_name
from minidp.strategies import names, strategy_class

MAX_CONFIG_BYTES = 1 << 20  # a settings file; anything larger is not one

HELP = {
    "model": f"one of {', '.join(MODELS)}", "dataset": f"one of {', '.join(DATASETS)}",
    "strategy": ", ".join(names()),
    "batch_size": f"samples per worker per step (default {BATCH_SIZE})",
    "lr": "learning rate (default: the strategy's, docs/configuration.md)",
    "momentum": "momentum (default: the strategy's, docs/configuration.md)",
    "global_batch_size": "samples per step over all workers (instead of --batch-size)",
    "epochs": "passes over the training set", "seed": "initial weights, data order, dropout",
    "weight_decay": "L2 penalty added to the gradients",
    "trust_coefficient": "LARS's trust coefficient (eta)",
    "optimizer": "sgd or lars", "schedule": "constant, cosine, step or poly (per step)",
    "warmup_epochs": "linear learning-rate warm-up, at most --epochs", "ranks_per_node":
    "virtual nodes of this many consecutive ranks, a divisor of the job's ranks (default: the "
    "real shared-memory nodes)",
    "net_latency_us": "model: latency per inter-node message",
    "net_bandwidth_gbps": "model: inter-node bandwidth (0: unlimited)",
    "reader": "mpiio, memory, leader or strided", "dtype": "float32 or float64",
    "train_samples": "use the first N training samples", "test_samples": "the first N test "
    "samples", "allreduce": f"sync's algorithm: {', '.join(ALLREDUCE_ALGORITHMS)}",
    "out": "output directory of this run (default: a new runs/NNNN; runs/latest points at "
    "the newest)", "data_dir": "where NAME-train.mdp / NAME-test.mdp live",
    "checkpoint_every": "write a checkpoint every N epochs (0: never)",
    "stop_after": "stop after N epochs of this job (resume later)",
    "comm_timeout": "seconds a rank waits for others before naming the missing ones",
    "slowdown": "RANK:FACTOR[,...]: make those ranks' compute FACTOR times slower "
    "(stragglers on one machine)",
    "inject_fault": f"RANK:STEP:KIND[,...]: a fault at that rank's STEP-th step, KIND one of "
    f"{', '.join(faults.KINDS)} (tests, teaching)",
    "explain": "print every communication of each rank's first N steps, with the "
    "strategy's docstring (also MINIDP_EXPLAIN=N)",
}


def parse_set(items: list[str], strategy: str) -> dict[str, str]:
    """``["daso.max_global_skips=4"]`` -> ``{"max_global_skips": "4"}`` for ``strategy``."""
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        owner, dot, name = key.strip().partition(".")
        if not sep or not dot or not name:
            raise ValueError(f"--set: got {item!r}, allowed: STRATEGY.OPTION=VALUE "
                             "(e.g. daso.max_global_skips=4)")
        if owner != strategy:
            raise ValueError(f"--set: {item!r} is an option of {owner!r}, but --strategy is "
                             f"{strategy!r}")
        options[name] = value.strip()
    return options


def read_config_file(path: str) -> bytes:
    """The bytes of the ``--config`` file: a regular file of at most :data:`MAX_CONFIG_BYTES`.

    Checked before reading: ``/dev/zero`` or a FIFO would be read until memory runs out,
    or for ever.
    """
    try:
        info = os.stat(path)
    except OSError as exc:
        why = "does not exist" if isinstance(exc, FileNotFoundError) else exc.strerror
        raise ValueError(f"--config: '{path}' {why}; allowed: a TOML file of settings") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"--config: '{path}' is {file_kind(info.st_mode)}, not a regular file; "
                         "allowed: a TOML file of settings")
    if info.st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"--config: '{path}' has {info.st_size} bytes; allowed: a TOML file of "
                         f"settings, at most {MAX_CONFIG_BYTES} bytes")
    try:
        with open(path, "rb") as f:
            return f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"--config: '{path}' cannot be read: {exc.strerror}") from None


def from_toml(path: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(settings, per-strategy option tables) of a TOML config file."""
    try:
        data = tomllib.loads(read_config_file(path).decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        # TOML is UTF-8: other bytes are a decoding error, not a TOML syntax error
        raise ValueError(f"--config {path}: not valid TOML: {exc}") from None
    settings, tables, keys = {}, {}, {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name in keys:  # batch_size and batch-size: one setting, given twice
            raise ValueError(f"--config {path}: {keys[name]!r} and {key!r} are the same "
                             "setting; give it once")
        keys[name] = key
        if isinstance(value, dict):
            try:
                strategy_class(key)  # a table holds one strategy's options
            except ValueError as exc:
                raise ValueError(f"--config {path}: table [{key}]: {exc}") from None
            tables[key] = value
        elif name in FIELDS and name not in ("options",):
            settings[name] = check_type(name, value, f"--config {path}: {key}")
        else:
            valid = ", ".join(sorted(flag_name(n) for n in FIELDS if n != "options"))
            raise ValueError(f"--config {path}: unknown setting {key!r}; valid settings: {valid}")
    return settings, tables


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``train`` flags to ``parser``; unset flags stay absent (SUPPRESS)."""
    add = parser.add_argument
    opt = {"default": argparse.SUPPRESS}
    add("--config", **opt, help="TOML file of settings (flags override it)")
    for name, f in FIELDS.items():
        if name in ("options", "progress", "verify", "resume", "nesterov", "overwrite"):
            continue
        kind = {"int": int, "float": float, "str": str}[str(f.type).removesuffix(" | None")]
        add(f"--{flag_name(name)}", type=kind, **opt,
            help=(HELP.get(name, "") + ("" if f.default is None else
                                        f" (default {f.default})")).strip())
    add("--nesterov", action="store_true", **opt, help="Nesterov momentum")
    add("--resume", nargs="?", const="yes", metavar="auto", **opt,
        help="continue the run in --out (default: runs/latest) from its latest checkpoint, "
        "refusing another configuration; --resume auto: continue if there is a checkpoint, "
        "else start (for requeued batch jobs)")
    add("--overwrite", action="store_true", **opt,
        help="clear the run files of an --out that holds another run, then start")
    add("--no-progress", dest="progress", action="store_false", **opt,
        help="no progress within epochs (bar or lines, docs/configuration.md)")
    add("--no-verify", dest="verify", action="store_false", **opt,
        help="skip the dataset files' checksum check at start (one read of each file)")
    add("--set", action="append", default=[], metavar="STRATEGY.OPTION=VALUE",
        help="a strategy option (repeatable)")
    return parser


class _Refusing(argparse.ArgumentParser):
    """train's parser whose complaint is raised (ValueError), never printed with a usage."""

    def error(self, message: str) -> None:  # noqa: D102 (argparse's hook)
        raise ValueError(f"{message} (see python -m minidp train --help)")


def check_command_line(argv: list[str]) -> TrainConfig:
    """The checked configuration of ``minidp train ARGV``, as train makes it; else ValueError.

    For commands that start train jobs (``compare``, ``simulate --validate``): a flag
    that train would refuse is refused before any job starts, in train's own words.
    """
    return from_args(build_parser(_Refusing(prog="minidp train", add_help=False))
                     .parse_args(argv))


def from_args(args: argparse.Namespace) -> TrainConfig:
    """Merge defaults, the --config file and the given flags into a checked TrainConfig."""
    settings, tables = from_toml(args.config) if getattr(args, "config", None) else ({}, {})
    given = {k: v for k, v in vars(args).items() if k in FIELDS}
    settings.update(given)
    config = TrainConfig(**settings)
    options = dict(tables.get(config.strategy, {}))
    for other in tables:
        if other != config.strategy:
            raise ValueError(f"--config: table [{other}] holds options of {other!r}, but the "
                             f"strategy is {config.strategy!r}")
    options.update(parse_set(args.set, config.strategy))
    config.options = options
    config.check()
    config.flags_given = frozenset(settings)  # not a field: run.json records values only
    return config


def given_settings(config: TrainConfig) -> dict[str, Any]:
    """The settings the user gave, with their values (a strategy names those it ignores).

    Those :func:`from_args` found on the command line or in the ``--config`` file; for a
    configuration built in code, those that differ from the defaults.
    """
    names = getattr(config, "flags_given", None)
    if names is None:
        names = [name for name, f in FIELDS.items() if f.default is not dataclasses.MISSING
                 and getattr(config, name) != f.default]
    return {name: getattr(config, name) for name in names}
