"""``simulate --validate``: run each strategy for real here and hold it against the prediction.

Each strategy runs as its own job, ``mpiexec -n P*G python -m mpi4py -m minidp train``
with the simulator's flags (virtual nodes, the network model on), the ranks of virtual
node p bound to cores of their own (``--cores-per-node`` C each, so the run is the
simulated cluster of P nodes of C cores). Its epochs' ``wall_s`` from ``metrics.jsonl``
are compared with the predicted epoch. The first epoch is left out when later ones of
the same phase exist (it pays first touches of buffers and windows). DASO runs with one
warm-up and one cool-down epoch unless ``--set`` says otherwise: its blocking epochs are
compared with the blocking prediction, the ones between with the cycling one.

Other jobs on this machine only ever add time, to the runs and to the timed step alike,
so with ``--repeats R`` each strategy runs R times, the step is timed before each run,
and the fastest run is compared with the prediction from the fastest step (the spread
of the runs is shown beside it).

``--real-nodes`` runs on the nodes MPI gives the job instead (hosts: its shared-memory
nodes), with no ``--ranks-per-node`` and no binding (a host's ranks run on its own
cores), placed by ``--mpiexec-args`` (default ``$MINIDP_MPIEXEC_ARGS``): on a cluster,
the hosts of an allocation; here, the real hosts of ``tests/hosts_cli.py shell
--cores-per-host C``, which sets that variable. Each run must come out P nodes x G
ranks, else the comparison is refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import tempfile

import numpy as np

from minidp.comm import mpi_library
from minidp.reporting.launcher import mpiexec, run_job
from minidp.run import environment
from minidp.run.flags import check_command_line
from minidp.simulate.costs import Epoch
from minidp.simulate.measure import build_model, measure_step, node_cores
from minidp.simulate.predict import Setup, costed, parse_strategies, table

TIMEOUT_S = 600


class JobFailed(RuntimeError):
    """A validation run failed; the message is one line: the run, its status, its last line."""


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One predicted epoch against the measured epochs of the same phase."""

    label: str
    predicted: Epoch
    step_s: float  # the one-core step the prediction used
    measured_s: float  # the fastest run's mean epoch of this phase
    measured_comm_share: float
    runs_s: list[float]  # every run's mean epoch of this phase
    epochs: list[int]  # which epochs (1-based) were measured
    command: str

    @property
    def error(self) -> float:
        """(predicted - measured) / measured."""
        return (self.predicted.seconds - self.measured_s) / self.measured_s


def option_sets(args: argparse.Namespace, strategy: str) -> list[str]:
    """The run's ``--set`` items for ``strategy``: the given ones, then its own defaults.

    The defaults are the strategy's ``Costed.validate_with`` (DASO's phases: one warm-up
    and one cool-down epoch), each unless ``--set`` gives that option.
    """
    sets = [s for s in args.set if s.startswith(f"{strategy}.")]
    for item in costed(strategy).validate_with:
        option = item.partition("=")[0]
        if not any(s.startswith(f"{strategy}.{option}=") for s in sets):
            sets.append(f"{strategy}.{item}")
    return sets


def train_flags(args: argparse.Namespace, strategy: str) -> list[str]:
    """The ``train`` flags of the run that checks ``strategy``'s prediction."""
    nodes = [] if args.real_nodes else ["--ranks-per-node", str(args.ranks_per_node)]
    flags = ["--model", args.model, "--dataset", args.dataset, "--strategy", strategy,
             "--epochs", str(args.epochs), "--batch-size", str(args.batch_size),
             *nodes, "--dtype", args.dtype,
             "--net-latency-us", f"{args.net_latency_us:g}",
             "--net-bandwidth-gbps", f"{args.net_bandwidth_gbps:g}",
             "--test-samples", "500", "--data-dir", args.data_dir, "--no-progress"]
    if args.samples:
        flags += ["--train-samples", str(args.samples)]
    if costed(strategy).allreduce:
        flags += ["--allreduce", args.allreduce]
    for item in option_sets(args, strategy):
        flags += ["--set", item]
    return flags


def binding(cores: list[list[int]], ranks_per_node: int, library: str) -> list[str]:
    """The mpiexec flags that bind the ranks of virtual node p to its cores (Hydra's).

    Without it, the kernel moves ranks between the machine's cores: a node whose peer
    node sleeps in the network model computes on both cores, one that shares a core
    with its own other rank waits at every barrier, and epochs vary by a third.
    Only MPICH's launcher (Hydra) binds a rank to a list of cores from the command line;
    under another MPI (Open MPI's ``mpiexec`` needs a rankfile) the ranks run unbound,
    and the measured epochs vary more.
    """
    if not library.startswith("MPICH"):
        return []
    ranks = ["+".join(map(str, node)) for node in cores for _ in range(ranks_per_node)]
    return ["-bind-to", "user:" + ",".join(ranks)]


def placement(args: argparse.Namespace) -> list[str]:
    """The extra mpiexec arguments of ``--mpiexec-args``, else ``$MINIDP_MPIEXEC_ARGS``."""
    if args.mpiexec_args is None:
        return environment.mpiexec_args()
    try:
        return shlex.split(args.mpiexec_args)
    except ValueError as exc:
        raise ValueError(f"--mpiexec-args: got {args.mpiexec_args!r}, allowed: mpiexec "
                         f"arguments as a shell splits them ({str(exc).lower()})") from None


def check_train_flags(args: argparse.Namespace, strategies: list[str]) -> None:
    """Each run's flags checked by train's own code before any run starts (ValueError)."""
    for name in strategies:
        try:
            check_command_line(train_flags(args, name))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"--validate: the {name} run would be refused by train: {exc}") \
                from None


def check_nodes(out: str, nodes: int, ranks_per_node: int) -> str:
    """With ``--real-nodes``: the run's nodes, described; ValueError unless P x G."""
    with open(os.path.join(out, "run.json")) as f:
        machines = json.load(f)["machines"]
    found = ", ".join(f"{m['host']} (ranks {m['ranks'][0]}-{m['ranks'][-1]})" for m in machines)
    if len(machines) != nodes or any(len(m["ranks"]) != ranks_per_node for m in machines):
        raise ValueError(f"--real-nodes: the run's nodes were {found}; allowed: {nodes} "
                         f"nodes of {ranks_per_node} ranks, as simulated (place them with "
                         f"--mpiexec-args or ${environment.MPIEXEC_ARGS})")
    return found


def launch(ranks: int, flags: list[str], out: str, place: list[str]) -> list[dict]:
    """Run one training job; its metrics.jsonl rows. Raises :class:`JobFailed` if it fails.

    ``place``: the mpiexec arguments before ``-n`` (a placement, a binding).
    """
    cmd = [mpiexec(), *place, "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "minidp",
           "train", *flags, "--out", out]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.setdefault("MPIEXEC_TIMEOUT", str(TIMEOUT_S - 30))
    status, output = run_job(cmd, TIMEOUT_S, env)
    if status != 0:
        # minidp's own error line, not the launcher's banner after it (Open MPI's mpirun
        # reports a non-zero status in a box of dashes)
        lines = output.strip().splitlines() or ["(no output)"]
        last = next((line for line in reversed(lines) if line.startswith("error: ")),
                    lines[-1])
        raise JobFailed(f"simulate --validate: a run failed (exit {status}), its last line: "
                        f"{last.strip()} -- the run: {shlex.join(cmd)}")
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _phase_epochs(epoch: Epoch, total: int, options: dict) -> list[int]:
    """The 0-based epochs of a run that ``epoch`` predicts (the first only if alone)."""
    phases = costed(epoch.strategy).phases
    chosen = list(range(total)) if phases is None else phases(options, total)[epoch.phase]
    return chosen[1:] if len(chosen) > 1 and chosen[0] == 0 else chosen


def compare(args: argparse.Namespace, setup: Setup) -> list[Comparison]:
    """Run each strategy ``--repeats`` times here; compare with its prediction per phase."""
    check_train_flags(args, list(setup.strategies))
    ranks = setup.nodes[0] * args.ranks_per_node
    bind = [] if args.real_nodes else binding(node_cores(setup.nodes[0], args.cores_per_node),
                                              args.ranks_per_node, mpi_library())
    place = placement(args) + bind
    rows = []
    with tempfile.TemporaryDirectory(prefix="minidp-simulate-") as tmp:
        for name in setup.strategies:
            flags = train_flags(args, name)
            steps, runs = [setup.node.step_s], []
            for repeat in range(args.repeats):
                if args.step_ms is None and repeat:  # setup() timed the first
                    model = build_model(args.model, args.dataset, args.dtype)
                    steps.append(measure_step(model, args.dataset, args.batch_size,
                                              args.measure_steps))
                out = os.path.join(tmp, f"{name}-{repeat}")
                runs.append(launch(ranks, flags, out, place))
                where = check_nodes(out, setup.nodes[0], args.ranks_per_node) \
                    if args.real_nodes else f"{setup.nodes[0]} virtual nodes"
            one = dataclasses.replace(setup, strategies={name: setup.strategies[name]},
                                      node=dataclasses.replace(setup.node, step_s=min(steps)))
            command = shlex.join(["mpiexec", *place, "-n", str(ranks), "python", "-m", "mpi4py",
                                  "-m", "minidp", "train", *flags]) + f"  # on {where}"
            phases = parse_strategies(name, option_sets(args, name))[name]
            for epoch in one.predict(setup.nodes[0], args):
                chosen = _phase_epochs(epoch, len(runs[0]), phases)
                if not chosen:  # e.g. DASO's cycling phase in a run of too few epochs
                    continue
                walls = [float(np.mean([m[e]["wall_s"] for e in chosen])) for m in runs]
                best = runs[int(np.argmin(walls))]
                share = np.mean([best[e]["comm_s"] / best[e]["wall_s"] for e in chosen])
                rows.append(Comparison(epoch.label, epoch, min(steps), min(walls), float(share),
                                       walls, [e + 1 for e in chosen], command))
    return rows


def comparison_table(rows: list[Comparison]) -> str:
    """Predicted against measured, one row per phase, then the commands that measured."""
    body = [[r.label, ",".join(map(str, r.epochs)), f"{r.step_s * 1e3:.2f}",
             f"{r.predicted.seconds:.2f}", f"{r.measured_s:.2f}",
             f"{min(r.runs_s):.2f}-{max(r.runs_s):.2f}", f"{r.error:+.0%}",
             f"{r.predicted.comm_share:.0%}", f"{r.measured_comm_share:.0%}"] for r in rows]
    lines = [table(["strategy", "epochs", "step ms", "predicted s", "measured s", "runs s",
                    "error", "predicted comm %", "measured comm %"], body), "",
             "measured by:"]
    lines += sorted({f"  {r.command}" for r in rows})
    return "\n".join(lines)
