"""The training configuration: flags, a TOML file, ``--set`` options, and their checks.

Precedence: defaults < ``--config FILE`` < flags given on the command line. In the
TOML file, top-level keys are the flag names (``batch_size`` or ``batch-size``) and
a table named after a strategy holds its options::

    strategy = "daso"
    epochs = 5
    [daso]
    max_global_skips = 4

``--set daso.max_global_skips=4`` does the same from the command line. Every value, from
whichever source, goes through the same checks here, before any rank communicates: its
type (:func:`check_type`: a bool for ``nesterov``, an int for counts, a number for
rates), then its range (finite numbers only), with an error naming the flag (or the file
and key), the value and what is allowed.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import tomllib
from typing import Any

from minidp import faults
from minidp.comm import ALLREDUCE_ALGORITHMS
from minidp.io.datasets import DATASETS
from minidp.io.readers import READERS
from minidp.layers import MODELS, Parameter
from minidp.optim import LARS, SGD, CosineLR, PolynomialLR, Schedule, StepLR
from minidp.optim.schedules import WarmupLR
from minidp.strategies import names, strategy_class

OPTIMIZERS = ("sgd", "lars")
SCHEDULES = ("constant", "cosine", "step", "poly")
DTYPES = ("float32", "float64")
RESUME = ("no", "yes", "auto")


class UsageError(ValueError):
    """A user error that every rank raises alike (decided on rank 0 and broadcast)."""


@dataclasses.dataclass
class TrainConfig:
    """Everything one training run depends on (``summary.json`` records it whole)."""

    model: str = "lenet5"
    dataset: str = "fashion-mnist"
    strategy: str = "sync"
    epochs: int = 5
    batch_size: int | None = None
    global_batch_size: int | None = None
    lr: float = 0.05
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 0.0
    optimizer: str = "sgd"
    trust_coefficient: float = 0.001
    schedule: str = "constant"
    warmup_epochs: int = 0
    seed: int = 0
    ranks_per_node: int | None = None
    net_latency_us: float = 0.0
    net_bandwidth_gbps: float = 0.0
    reader: str = "mpiio"
    dtype: str = "float32"
    train_samples: int | None = None
    test_samples: int | None = None
    allreduce: str = "mpi"
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    out: str | None = None
    data_dir: str = "data"
    checkpoint_every: int = 0
    resume: str = "no"
    overwrite: bool = False
    stop_after: int | None = None
    comm_timeout: float | None = None
    progress: bool = True
    verify: bool = True
    slowdown: str | None = None
    inject_fault: str | None = None
    explain: int = 0

    def slowdowns(self) -> dict[int, float]:
        """``--slowdown "1:3,2:1.5"`` as {rank: factor}; empty when not given."""
        found: dict[int, float] = {}
        for item in (self.slowdown or "").split(","):
            if not item.strip():
                continue
            rank, sep, factor = item.partition(":")
            try:
                r, f = int(rank), float(factor)
            except ValueError:
                r, f = -1, 0.0
            if not sep or r < 0 or not (f >= 1 and f < float("inf")):
                raise ValueError(f"--slowdown: got {item.strip()!r}, allowed: RANK:FACTOR "
                                 "with RANK an int >= 0 and FACTOR a finite number >= 1, "
                                 "comma-separated (e.g. 3:3,1:1.5)")
            found[r] = f
        return found

    def per_worker_batch(self, workers: int) -> int:
        """--batch-size, or --global-batch-size split evenly over the workers."""
        if self.global_batch_size is None:
            return 64 if self.batch_size is None else self.batch_size
        if self.global_batch_size < workers or self.global_batch_size % workers:
            raise ValueError(f"--global-batch-size: got {self.global_batch_size}, allowed: a "
                             f"multiple of the {workers} workers (at least one sample each)")
        return self.global_batch_size // workers

    def build_optimizer(self, params: list[Parameter]) -> SGD | LARS:
        """The local optimizer: --optimizer with --lr, --momentum, --weight-decay, ..."""
        if self.optimizer == "lars":
            return LARS(params, lr=self.lr, momentum=self.momentum,
                        weight_decay=self.weight_decay,
                        trust_coefficient=self.trust_coefficient)
        return SGD(params, lr=self.lr, momentum=self.momentum, nesterov=self.nesterov,
                   weight_decay=self.weight_decay)

    def lr_schedule(self, steps_per_epoch: int) -> Schedule:
        """--schedule over the run's steps, after --warmup-epochs of linear warm-up."""
        total = self.epochs * steps_per_epoch
        schedule = {"constant": lambda: Schedule(self.lr),
                    "cosine": lambda: CosineLR(self.lr, total),
                    "step": lambda: StepLR(self.lr, max(1, total // 3)),
                    "poly": lambda: PolynomialLR(self.lr, total)}[self.schedule]()
        if self.warmup_epochs:
            schedule = WarmupLR(schedule, self.warmup_epochs * steps_per_epoch)
        return schedule

    def check(self) -> TrainConfig:
        """Raise ValueError/TypeError naming the first bad setting; returns self."""
        for name in FIELDS:
            setattr(self, name, check_type(name, getattr(self, name)))
        choices = {"model": tuple(MODELS), "dataset": DATASETS, "optimizer": OPTIMIZERS,
                   "schedule": SCHEDULES, "reader": READERS, "dtype": DTYPES,
                   "allreduce": ALLREDUCE_ALGORITHMS, "strategy": tuple(names())}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"--{_flag(name)}: got {getattr(self, name)!r}, allowed: "
                                 f"{', '.join(allowed)}")
        self.options = strategy_class(self.strategy).parse_options(self.options)
        for name, value in self.options.items():
            if isinstance(value, float) and not math.isfinite(value):
                allowed = strategy_class(self.strategy).options[name].allowed
                raise ValueError(f"{self.strategy}.{name}: got {value!r}, allowed: a finite "
                                 f"number, {allowed}")
        _positive("epochs", self.epochs)
        for name in ("batch_size", "global_batch_size", "train_samples", "test_samples",
                     "ranks_per_node", "stop_after"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.batch_size is not None and self.global_batch_size is not None:
            raise ValueError("--batch-size and --global-batch-size: give one of them, not both")
        for name in ("checkpoint_every", "warmup_epochs", "seed", "explain"):
            _positive(name, getattr(self, name), minimum=0)
        for name in ("lr", "trust_coefficient"):
            _number(name, getattr(self, name), lambda v: v > 0, "a finite number > 0")
        _number("momentum", self.momentum, lambda v: 0 <= v < 1, "a number in [0, 1)")
        for name in ("weight_decay", "net_latency_us", "net_bandwidth_gbps"):
            _number(name, getattr(self, name), lambda v: v >= 0, "a finite number >= 0")
        self.slowdowns()
        faults.parse(self.inject_fault)
        if self.comm_timeout is not None:
            _number("comm_timeout", self.comm_timeout, lambda v: v > 0,
                    "a finite number of seconds > 0")
        if self.resume not in RESUME:
            raise ValueError(f"--resume: got {self.resume!r}, allowed: --resume alone (continue "
                             "the latest checkpoint), --resume auto (continue one if there is "
                             "one, else start), or no --resume")
        if self.overwrite and self.resume != "no":
            raise ValueError("--overwrite and --resume: give one of them, not both (--overwrite "
                             "clears the run that --resume would continue)")
        if self.stop_after is not None and not self.checkpoint_every:
            raise ValueError(f"--stop-after {self.stop_after}: allowed only with "
                             "--checkpoint-every N (N >= 1): a stopped run continues from its "
                             "checkpoint with --resume")
        return self


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _positive(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"--{_flag(name)}: got {value!r}, allowed: an int >= {minimum}")


def _number(name: str, value: Any, ok: Any, allowed: str) -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or not ok(value)):
        raise ValueError(f"--{_flag(name)}: got {value!r}, allowed: {allowed}")


FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
_KINDS = {"bool": (bool, "a bool (true or false)"), "int": (int, "an int"),
          "float": (float, "a number"), "str": (str, "a string"),
          "dict[str, Any]": (dict, "a table of options")}


def check_type(name: str, value: Any, where: str | None = None) -> Any:
    """``value`` as the field ``name`` of TrainConfig holds it, or raise TypeError.

    The one type check for flags, TOML values and code alike: an int where an int is
    due (not a bool, not 2.0), a bool where a bool is due (not ``"false"``), an int or
    float where a number is due (returned as float). Ranges, finiteness included, are
    checked by :meth:`TrainConfig.check`.

    Args:
        name: the field.
        value: the value, from any source.
        where: how the error names the source (default ``--flag``).
    """
    kind = str(FIELDS[name].type)
    optional = kind.endswith(" | None")
    python_type, words = _KINDS[kind.removesuffix(" | None")]
    if value is None and optional:
        return None
    if python_type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, python_type) or (python_type is int and isinstance(value, bool)):
        raise TypeError(f"{where or '--' + _flag(name)}: got {value!r} "
                        f"({type(value).__name__}), allowed: {words}"
                        + (" or unset" if optional else ""))
    return value
HELP = {
    "model": f"one of {', '.join(MODELS)}", "dataset": f"one of {', '.join(DATASETS)}",
    "strategy": ", ".join(names()),
    "batch_size": "samples per worker per step (default 64)",
    "global_batch_size": "samples per step over all workers (instead of --batch-size)",
    "optimizer": "sgd or lars", "schedule": "constant, cosine, step or poly (per step)",
    "warmup_epochs": "linear learning-rate warm-up", "ranks_per_node": "virtual nodes of "
    "this many consecutive ranks (default: the real shared-memory nodes)",
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


def from_toml(path: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(settings, per-strategy option tables) of a TOML config file."""
    with open(path, "rb") as f:
        try:
            data = tomllib.load(f)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            # TOML is UTF-8: other bytes are a decoding error, not a TOML syntax error
            raise ValueError(f"--config {path}: not valid TOML: {exc}") from None
    settings, tables = {}, {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if isinstance(value, dict):
            try:
                strategy_class(key)  # a table holds one strategy's options
            except ValueError as exc:
                raise ValueError(f"--config {path}: table [{key}]: {exc}") from None
            tables[key] = value
        elif name in FIELDS and name not in ("options",):
            settings[name] = check_type(name, value, f"--config {path}: {key}")
        else:
            valid = ", ".join(sorted(_flag(n) for n in FIELDS if n != "options"))
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
        add(f"--{_flag(name)}", type=kind, **opt,
            help=(HELP.get(name, "") + ("" if f.default is None else
                                        f" (default {f.default})")).strip())
    add("--nesterov", action="store_true", **opt, help="Nesterov momentum")
    add("--resume", nargs="?", const="yes", metavar="auto", **opt,
        help="continue the run in --out (default: runs/latest) from its latest checkpoint, "
        "refusing another configuration; --resume auto: continue if there is a checkpoint, "
        "else start (for requeued batch jobs)")
    add("--overwrite", action="store_true", **opt,
        help="clear the run files of an --out that holds another run, then start")
    add("--no-progress", dest="progress", action="store_false", **opt, help="no progress bar")
    add("--no-verify", dest="verify", action="store_false", **opt,
        help="skip the dataset files' checksum check at start (one read of each file)")
    add("--set", action="append", default=[], metavar="STRATEGY.OPTION=VALUE",
        help="a strategy option (repeatable)")
    return parser


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
    return config.check()
