"""The prediction: flags checked, this machine measured, each strategy's epoch on P nodes.

:func:`setup` checks the ``simulate`` flags and times one step and one memory sweep here
(:mod:`minidp.simulate.measure`); :func:`predict` puts P nodes of G ranks around them
with the formulas of :mod:`minidp.simulate.costs`. DASO is predicted per phase: a
blocking epoch (warm-up and cool-down, (B,S,L) = (0,0,0)) and a cycling epoch with the
(B,S,L) its schedule sets right after warm-up ((4,1,1) with the defaults; later
plateaus change it). Two elastic strategies are modelled too, on request (``--strategy
easgd-rr,easgd-sync``): the original round-robin EASGD, whose master serves one worker
at a time, and Sync EASGD's trees, the comparison of SC17. Which strategies are
modelled, and how, is a table keyed by the strategy's class (:data:`COSTS`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from minidp.comm.network import NetworkModel
from minidp.simulate.costs import (
    Cluster,
    Epoch,
    Node,
    daso_epoch,
    hbsgd_epoch,
    hsgd_epoch,
    sync_epoch,
)
from minidp.simulate.elastic import easgd_rr_epoch, easgd_sync_epoch
from minidp.simulate.measure import DATASETS, build_model, measure_step, measure_sweep, node_cores
from minidp.strategies import (
    DASO,
    DASOSchedule,
    ElasticRoundRobin,
    ElasticSync,
    HierarchicalBulkSGD,
    HierarchicalSGD,
    Strategy,
    SyncSGD,
    names,
    strategy_class,
)


@dataclasses.dataclass(frozen=True)
class Work:
    """What every strategy's prediction starts from, besides the cluster and its options."""

    samples: int  # training samples per epoch
    batch: int  # per rank
    batches: int  # steps per epoch of a rank that shares the samples with every other
    nbytes: float  # the parameter (and gradient) buffer
    itemsize: int
    allreduce: str  # sync's --allreduce


def _sync(cluster: Cluster, w: Work, options: dict[str, Any]) -> list[Epoch]:
    return [sync_epoch(cluster, w.batches, w.nbytes, w.itemsize, w.allreduce)]


def _hsgd(cluster: Cluster, w: Work, options: dict[str, Any]) -> list[Epoch]:
    return [hsgd_epoch(cluster, w.batches, w.nbytes, w.itemsize, options)]


def _hbsgd(cluster: Cluster, w: Work, options: dict[str, Any]) -> list[Epoch]:
    return [hbsgd_epoch(cluster, w.batches, w.nbytes, w.itemsize, options["k"])]


def _daso(cluster: Cluster, w: Work, options: dict[str, Any]) -> list[Epoch]:
    """A blocking epoch, and the first cycling one after warm-up (if the run cycles)."""
    epochs = [daso_epoch(cluster, w.batches, w.nbytes, w.itemsize, (0, 0, 0))]
    warmup = options["warmup_epochs"]
    if warmup and cluster.nodes > 1:  # warm-up 0: Heat's schedule never cycles
        # the values DASO's own schedule sets for the first epoch after warm-up
        names = ("warmup_epochs", "cooldown_epochs", "max_global_skips",
                 "skip_reduction_factor", "local_skip_factor", "stability_level", "patience")
        schedule = DASOSchedule(warmup + options["cooldown_epochs"] + 1,
                                **{n: options[n] for n in names})
        cycle = schedule.update(warmup, 1.0)
        epochs.append(daso_epoch(cluster, w.batches, w.nbytes, w.itemsize, cycle))
    return epochs


def _daso_phases(options: dict[str, Any], total: int) -> dict[str, list[int]]:
    """The 0-based epochs of a run of ``total`` in each phase: warm-up and cool-down block."""
    warmup, cooldown = options["warmup_epochs"], options["cooldown_epochs"]
    blocking = [e for e in range(total) if e < warmup or e >= total - cooldown]
    return {"blocking": blocking, "cycling": [e for e in range(total) if e not in blocking]}


def _easgd_rr(cluster: Cluster, w: Work, options: dict[str, Any]) -> list[Epoch]:
    workers = max(cluster.ranks - 1, 1)  # rank 0 is the master: the others share the samples
    return [easgd_rr_epoch(cluster, w.samples // workers // w.batch, w.nbytes, options["tau"])]


def _easgd_sync(cluster: Cluster, w: Work, options: dict[str, Any]) -> list[Epoch]:
    return [easgd_sync_epoch(cluster, w.batches, w.nbytes, w.itemsize, options["tau"],
                             options["mode"])]


@dataclasses.dataclass(frozen=True)
class Costed:
    """How the simulator predicts one strategy class, and how ``--validate`` runs it.

    Attributes:
        epochs: its predicted epochs on a cluster (one per phase of a run).
        allreduce: the run takes ``--allreduce`` (sync's; the others name their levels).
        validate_with: ``OPTION=VALUE`` items a ``--validate`` run sets unless ``--set``
            gives them (DASO: one warm-up and one cool-down epoch, so that it cycles).
        phases: the epochs of a run in each ``Epoch.phase``; None: one phase, the run.
    """

    epochs: Callable[[Cluster, Work, dict[str, Any]], list[Epoch]]
    allreduce: bool = False
    validate_with: tuple[str, ...] = ()
    phases: Callable[[dict[str, Any], int], dict[str, list[int]]] | None = None


# The strategies the alpha-beta formulas model, by class; the others' time depends on a
# server's queue and on staleness, which a sum of messages does not capture.
COSTS: dict[type[Strategy], Costed] = {
    SyncSGD: Costed(_sync, allreduce=True),
    HierarchicalSGD: Costed(_hsgd),
    HierarchicalBulkSGD: Costed(_hbsgd),
    DASO: Costed(_daso, validate_with=("warmup_epochs=1", "cooldown_epochs=1"),
                 phases=_daso_phases),
    ElasticRoundRobin: Costed(_easgd_rr),
    ElasticSync: Costed(_easgd_sync),
}
MODELLED = tuple(cls.name for cls in COSTS)
DEFAULT = MODELLED[:4]  # the synchronous family: --strategy's default


def costed(name: str) -> Costed:
    """How strategy ``name`` (one of :data:`MODELLED`) is predicted."""
    return COSTS[strategy_class(name)]


DTYPES = ("float32", "float64")


SYNC_US = 20.0  # a barrier of ranks that each have a core (assumed: polls, no sleep)


# With more ranks than cores, the peer a sync point waits for is off its core (1 - 1/s)
# of the time, for about a scheduler slice: Linux's 0.75 ms x (1 + log2 2 cores).
SLICE_US = 1500.0


def _check(name: str, value: float | None, ok: bool, allowed: str) -> None:
    if value is not None and not ok:
        raise ValueError(f"--{name}: got {value!r}, allowed: {allowed}")


def parse_nodes(text: str) -> list[int]:
    """``"2,4,8"`` -> [2, 4, 8]; raise naming --nodes unless every item is an int >= 1."""
    try:
        nodes = sorted({int(item) for item in text.split(",")})
    except ValueError:
        nodes = [0]
    if nodes[0] < 1:
        raise ValueError(f"--nodes: got {text!r}, allowed: an int >= 1 or a comma-separated "
                         "list of them (e.g. 2,4,8)")
    return nodes


def parse_strategies(text: str, sets: list[str]) -> dict[str, dict]:
    """{strategy: its checked options} from --strategy and --set (train's own checks)."""
    from minidp.run.config import strategy_options

    chosen = [name.strip() for name in text.split(",") if name.strip()]
    if not chosen:
        raise ValueError(f"--strategy: got {text!r}, allowed: {', '.join(MODELLED)}")
    for name in chosen:
        if name not in MODELLED:
            why = ("; the parameter-server and asynchronous elastic strategies are not "
                   "modelled (their time depends on a server's queue and on staleness, which "
                   "an alpha-beta sum of messages does not capture)") if name in names() else ""
            raise ValueError(f"--strategy: got {name!r}, allowed: {', '.join(MODELLED)}{why}")
    given: dict[str, dict[str, str]] = {name: {} for name in chosen}
    for item in sets:
        key, sep, value = item.partition("=")
        owner, dot, option = key.strip().partition(".")
        if not sep or not dot or owner not in given:
            raise ValueError(f"--set: got {item!r}, allowed: STRATEGY.OPTION=VALUE with "
                             f"STRATEGY one of --strategy ({', '.join(chosen)})")
        given[owner][option] = value.strip()
    return {name: strategy_options(name, given[name]) for name in chosen}


def check_args(args: argparse.Namespace) -> None:
    """Raise ValueError naming the first bad flag.

    The flags ``train`` has too are checked by train's own code (the network model's
    bounds: :func:`minidp.run.config.check_network`; the options:
    :func:`parse_strategies`), so that ``simulate`` never predicts a setting that ``train``
    would refuse.
    """
    from minidp.run.config import check_network

    for name in ("ranks_per_node", "batch_size", "measure_steps", "epochs", "repeats"):
        _check(name.replace("_", "-"), getattr(args, name), getattr(args, name) >= 1,
               "an int >= 1")
    _check("samples", args.samples, args.samples is None or args.samples >= 1, "an int >= 1")
    for name in ("cores_per_node", "links_per_node", "step_ms", "mem_gbps"):
        value = getattr(args, name)
        _check(name.replace("_", "-"), value, value is None or 0 < value < float("inf"),
               "a finite number > 0")
    check_network(args.net_latency_us, args.net_bandwidth_gbps)
    _check("sync-us", args.sync_us, args.sync_us is None or 0 <= args.sync_us < float("inf"),
           "a finite number >= 0")


def predict(cluster: Cluster, strategies: dict[str, dict], samples: int, batch: int,
            nbytes: float, itemsize: int, allreduce: str) -> list[Epoch]:
    """The predicted epochs of every strategy on ``cluster`` (DASO: two phases)."""
    batches = samples // cluster.ranks // batch
    if batches < 1:
        raise ValueError(f"--samples: got {samples}, allowed: at least {cluster.ranks * batch} "
                         f"(one batch of {batch} for each of the {cluster.ranks} ranks of "
                         f"{cluster.nodes} node(s))")
    work = Work(samples, batch, batches, nbytes, itemsize, allreduce)
    return [epoch for name, options in strategies.items()
            for epoch in costed(name).epochs(cluster, work, options)]


def speedup(rows: list[tuple[int, Epoch]], i: int) -> float:
    """Samples per second on rows[i]'s P over those on the first P (ideal: the P ratio)."""
    (p0, e0), (p, e) = rows[0], rows[i]
    return p * (e0.seconds / e0.batches) / (p0 * (e.seconds / e.batches))


def scaling(rows: list[tuple[int, Epoch]]) -> str:
    """Where one strategy's epochs (P ascending) stop scaling, in words."""
    slower = next((p for (_, a), (p, b) in zip(rows, rows[1:]) if b.seconds >= a.seconds), None)
    heavy = next((p for p, e in rows if e.comm_share > 0.5), None)
    (p0, _), (p, _) = rows[0], rows[-1]
    parts = [f"epoch time stops falling at P={slower}" if slower else
             f"epoch time still falls at P={p}",
             f"communication > 50% from P={heavy}" if heavy else
             "communication <= 50% throughout",
             f"speed-up P={p0}->{p}: {speedup(rows, -1):.1f}x of {p / p0:g}x"]
    return f"{rows[0][1].label}: " + "; ".join(parts)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table, columns right-aligned to their widest cell."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |"
             for r in [headers, *rows]]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Setup:
    """What the predictions start from: the flags checked, and what was measured here."""

    nodes: list[int]
    strategies: dict[str, dict]
    node: Node
    network: NetworkModel
    rule: str
    links: float | None
    samples: int
    params: int
    itemsize: int

    @property
    def nbytes(self) -> int:
        """Bytes of the parameter (and gradient) buffer."""
        return self.params * self.itemsize

    def predict(self, p: int, args: argparse.Namespace) -> list[Epoch]:
        """The epochs of every strategy on P = ``p`` nodes."""
        return predict(Cluster(p, self.node, self.network, self.rule, self.links),
                       self.strategies, self.samples, args.batch_size, self.nbytes,
                       self.itemsize, args.allreduce)


def setup(args: argparse.Namespace) -> Setup:
    """Check the flags, time a step and a memory sweep here (unless given)."""
    check_args(args)
    nodes = parse_nodes(args.nodes)
    strategies = parse_strategies(args.strategy, args.set)
    if args.validate and len(nodes) > 1:
        raise ValueError(f"--nodes: got {args.nodes!r} with --validate, allowed: one P (the "
                         "virtual nodes of a run on this machine)")
    rule = "emulated" if args.validate else args.network_rule
    if args.links_per_node is not None and rule == "emulated":
        raise ValueError(f"--links-per-node: got {args.links_per_node:g} with the emulated "
                         "rule, allowed: only with --network-rule mpich (minidp's network "
                         "model gives each rank its own link)")
    cores = args.cores_per_node or args.ranks_per_node
    if args.validate:
        cores = len(node_cores(nodes[0], args.cores_per_node)[0])
    model = build_model(args.model, args.dataset, args.dtype)
    params, itemsize = model.flat_parameters().size, np.dtype(args.dtype).itemsize
    step_s = (args.step_ms / 1e3 if args.step_ms else
              measure_step(model, args.dataset, args.batch_size, args.measure_steps))
    byte_s = 1 / (args.mem_gbps * 1e9) if args.mem_gbps else measure_sweep(params * itemsize)
    share = max(1.0, args.ranks_per_node / cores)
    sync_us = SYNC_US + (1 - 1 / share) * SLICE_US if args.sync_us is None else args.sync_us
    node = Node(step_s, byte_s, sync_us * 1e-6, args.ranks_per_node, cores)
    network = NetworkModel(args.net_latency_us, args.net_bandwidth_gbps)
    return Setup(nodes, strategies, node, network, rule, args.links_per_node,
                 args.samples or DATASETS[args.dataset][1], params, itemsize)
