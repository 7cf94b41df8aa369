"""The training configuration (:class:`TrainConfig`) and its checks.

Every value, from whichever source (flags, a TOML file, ``--set``: :mod:`minidp.run.flags`,
or code), goes through the same checks here, before any rank communicates: its type
(:func:`check_type`: a bool for ``nesterov``, an int for counts, a number for rates),
then its range (finite numbers only), with an error naming the flag (or the file and
key), the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from minidp.comm import ALLREDUCE_ALGORITHMS
from minidp.comm.guard import MIN_TIMEOUT_S
from minidp.io.datasets import DATASETS
from minidp.io.readers import READERS
from minidp.layers import MODELS
from minidp.optim import OPTIMIZERS, SCHEDULES
from minidp.run import faults
from minidp.strategies import STRATEGIES, SyncSGD, names, strategy_class

DTYPES = ("float32", "float64")
RESUME = ("no", "yes", "auto")
BATCH_SIZE = 32  # per worker, when neither --batch-size nor --global-batch-size is given

# (lr, momentum) of each strategy when --lr / --momentum are not given: a fact on its
# class (Strategy.default_rates, where each says why), gathered for the pages and reports.
STRATEGY_RATES = {name: cls.default_rates for name, cls in STRATEGIES.items()}

# Bounds of the modelling knobs: a factor or a modelled time beyond them would sleep for
# years (or overflow time.sleep), and the other ranks would time out waiting.
MAX_SLOWDOWN = 1000.0
MAX_LATENCY_US = 1e6  # one second per message
MIN_BANDWIDTH_GBPS, MAX_BANDWIDTH_GBPS = 1e-3, 1e6  # 1 Mbit/s to 1 Pbit/s (0: unlimited)


@dataclasses.dataclass
class TrainConfig:
    """Everything one training run depends on (``summary.json`` records it whole)."""

    model: str = "lenet5"
    dataset: str = "fashion-mnist"
    strategy: str = SyncSGD.name
    epochs: int = 5
    batch_size: int | None = None
    global_batch_size: int | None = None
    lr: float | None = None  # None: the strategy's rate (Strategy.default_rates)
    momentum: float | None = None
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
            if not sep or r < 0 or not 1 <= f <= MAX_SLOWDOWN:
                raise ValueError(f"--slowdown: got {item.strip()!r}, allowed: RANK:FACTOR "
                                 f"with RANK an int >= 0 and FACTOR a number in [1, "
                                 f"{MAX_SLOWDOWN:g}], comma-separated (e.g. 3:3,1:1.5)")
            found[r] = f
        return found

    def per_worker_batch(self, workers: int) -> int:
        """--batch-size, or --global-batch-size split evenly over the workers."""
        if self.global_batch_size is None:
            return BATCH_SIZE if self.batch_size is None else self.batch_size
        if self.global_batch_size < workers or self.global_batch_size % workers:
            raise ValueError(f"--global-batch-size: got {self.global_batch_size}, allowed: a "
                             f"multiple of the {workers} workers (at least one sample each)")
        return self.global_batch_size // workers

    def check(self) -> TrainConfig:
        """Raise ValueError/TypeError naming the first bad setting; returns self."""
        for name in FIELDS:
            setattr(self, name, check_type(name, getattr(self, name)))
        choices = {"model": tuple(MODELS), "dataset": DATASETS, "optimizer": OPTIMIZERS,
                   "schedule": SCHEDULES, "reader": READERS, "dtype": DTYPES,
                   "allreduce": ALLREDUCE_ALGORITHMS, "strategy": tuple(names())}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"--{flag_name(name)}: got {getattr(self, name)!r}, allowed: "
                                 f"{', '.join(allowed)}")
        lr, momentum = strategy_class(self.strategy).default_rates
        self.lr = lr if self.lr is None else self.lr
        self.momentum = momentum if self.momentum is None else self.momentum
        self.options = strategy_options(self.strategy, self.options)
        _positive("epochs", self.epochs)
        for name in ("batch_size", "global_batch_size", "train_samples", "test_samples",
                     "ranks_per_node", "stop_after"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if self.batch_size is not None and self.global_batch_size is not None:
            raise ValueError("--batch-size and --global-batch-size: give one of them, not both")
        for name in ("checkpoint_every", "warmup_epochs", "seed", "explain"):
            _positive(name, getattr(self, name), minimum=0)
        if self.warmup_epochs > self.epochs:
            # The rate would still be rising when the run ends: --lr never reached.
            raise ValueError(f"--warmup-epochs: got {self.warmup_epochs} with --epochs "
                             f"{self.epochs}, allowed: 0 to {self.epochs} (the warm-up raises "
                             "the rate linearly to --lr; one longer than the run ends at "
                             f"{self.epochs / self.warmup_epochs:.0%} of it); give --epochs "
                             f"{self.warmup_epochs} or more, or a shorter warm-up")
        for name in ("lr", "trust_coefficient"):
            _number(name, getattr(self, name), lambda v: v > 0, "a finite number > 0")
        _number("momentum", self.momentum, lambda v: 0 <= v < 1, "a number in [0, 1)")
        _number("weight_decay", self.weight_decay, lambda v: v >= 0, "a finite number >= 0")
        check_network(self.net_latency_us, self.net_bandwidth_gbps)
        self.slowdowns()
        faults.parse(self.inject_fault)
        if self.comm_timeout is not None:
            _number("comm_timeout", self.comm_timeout, lambda v: v >= MIN_TIMEOUT_S,
                    f"a finite number of seconds >= {MIN_TIMEOUT_S:g}")
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


def strategy_options(strategy: str, given: dict[str, Any]) -> dict[str, Any]:
    """``strategy``'s options with ``given`` over its defaults, each checked; finite numbers.

    The one check of strategy options for ``train`` and ``simulate``; ValueError naming
    ``STRATEGY.OPTION``, the value and what is allowed.
    """
    cls = strategy_class(strategy)
    options = cls.parse_options(given)
    for name, value in options.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{strategy}.{name}: got {value!r}, allowed: a finite number, "
                             f"{cls.options[name].allowed}")
    return options


def check_network(latency_us: Any, bandwidth_gbps: Any) -> None:
    """The network model's two flags, for ``train`` and ``simulate`` alike (ValueError)."""
    _number("net_latency_us", latency_us, lambda v: 0 <= v <= MAX_LATENCY_US,
            f"a finite number in [0, {MAX_LATENCY_US:g}] (microseconds per message)")
    _number("net_bandwidth_gbps", bandwidth_gbps,
            lambda v: v == 0 or MIN_BANDWIDTH_GBPS <= v <= MAX_BANDWIDTH_GBPS,
            f"0 (unlimited) or a finite number in [{MIN_BANDWIDTH_GBPS:g}, "
            f"{MAX_BANDWIDTH_GBPS:g}]")


def flag_name(name: str) -> str:
    """The command-line flag of the field ``name`` (``batch_size`` -> ``batch-size``)."""
    return name.replace("_", "-")


def _positive(name: str, value: Any, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"--{flag_name(name)}: got {value!r}, allowed: an int >= {minimum}")


def _number(name: str, value: Any, ok: Any, allowed: str) -> None:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or not ok(value)):
        raise ValueError(f"--{flag_name(name)}: got {value!r}, allowed: {allowed}")


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
        raise TypeError(f"{where or '--' + flag_name(name)}: got {value!r} "
                        f"({type(value).__name__}), allowed: {words}"
                        + (" or unset" if optional else ""))
    return value
