"""``python -m minidp simulate``: predicted epoch time and communication share at cluster scale.

One step of the model is timed here, in this process, on one thread, and one sweep over
the parameter buffer (``a += b``) gives shared memory's seconds per byte
(:mod:`minidp.simulate.measure`; nothing is cached). The formulas of
:mod:`minidp.simulate.costs` then put P nodes of G ranks around them: compute times the
node's oversubscription (``--cores-per-node``), node reductions in shared memory, and
each strategy's messages across nodes under the alpha-beta model of
``--net-latency-us`` and ``--net-bandwidth-gbps``. An epoch is
``samples // (P G) // batch`` steps, as in ``train``. DASO is predicted per phase: a
blocking epoch (warm-up and cool-down, (B,S,L) = (0,0,0)) and a cycling epoch with the
(B,S,L) its schedule sets right after warm-up ((4,1,1) with the defaults; later
plateaus change it; :mod:`minidp.simulate.predict`). ``--validate`` runs the same
configuration for real on this machine and prints predicted against measured
(:mod:`minidp.simulate.validate`).
docs/simulate.md gives the method and the formulas.

Exit status: 0 done; 2 a bad flag or ``MINIDP_*`` variable (one line; the flags that
``train`` has too are checked by train's own code, so nothing is predicted that train
would refuse); 1 a ``--validate`` run failed (one line: its status, its last line, the
run).
"""

from __future__ import annotations

import argparse
import sys

from minidp.simulate.costs import RULES, WORLD_ALGORITHMS, Epoch, mpich_algorithm
from minidp.simulate.measure import DATASETS
from minidp.simulate.predict import (
    DEFAULT,
    DTYPES,
    MODELLED,
    SLICE_US,
    SYNC_US,
    Setup,
    scaling,
    setup,
    speedup,
    table,
)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``simulate`` flags to ``parser``; returns it."""
    from minidp.layers import MODELS

    add = parser.add_argument
    add("--nodes", default="2,4,8,16,32,64", help="P, or a comma-separated list of P")
    add("--ranks-per-node", type=int, default=2, help="G, ranks on each node (default 2)")
    add("--cores-per-node", type=float, default=None,
        help="cores the G ranks of a node share (default G: one core each; with "
             "--validate: this machine's cores // P, the ranks bound to them)")
    add("--strategy", default=",".join(DEFAULT),
        help=f"one or a comma-separated list of {', '.join(MODELLED)} (default: "
             f"{', '.join(DEFAULT)})")
    add("--model", default="lenet5", choices=tuple(MODELS))
    add("--dataset", default="fashion-mnist", choices=tuple(DATASETS),
        help="sets the sample shape and the default --samples")
    add("--batch-size", type=int, default=64, help="per rank, as in train (default 64)")
    add("--samples", type=int, default=None, help="training samples per epoch "
        "(default: the data set's)")
    add("--dtype", default="float32", choices=DTYPES)
    add("--allreduce", default="mpi", choices=WORLD_ALGORITHMS,
        help="sync's allreduce (default mpi, as in train)")
    add("--net-latency-us", type=float, default=0.0, help="alpha per message between nodes")
    add("--net-bandwidth-gbps", type=float, default=0.0,
        help="bandwidth between nodes per rank (0: unlimited, as in train)")
    add("--links-per-node", type=float, default=None,
        help="network links of a node, shared by its ranks that send at once (default: one "
             "per rank, as minidp's network model; 1: one NIC per node); rule mpich only")
    add("--network-rule", default="mpich", choices=RULES,
        help="mpich: what MPICH's algorithms send across nodes on a cluster (default); "
             "emulated: what minidp's network model charges a run on one machine")
    add("--set", action="append", default=[], metavar="STRATEGY.OPTION=VALUE",
        help="a strategy option, as in train (hsgd.*, hbsgd.k, daso.*, easgd-*.tau, "
             "easgd-sync.mode)")
    add("--step-ms", type=float, default=None,
        help="a step's compute on one core in ms, instead of timing it here")
    add("--measure-steps", type=int, default=20, help="steps timed (median; default 20)")
    add("--mem-gbps", type=float, default=None,
        help="shared-memory sweep rate in GB/s, instead of measuring it here")
    add("--sync-us", type=float, default=None,
        help="one sync point (a node barrier, the ranks of a blocking collective meeting); "
             f"default {SYNC_US:g} us, plus (1 - 1/s) x {SLICE_US:g} us when s ranks share a "
             "core (a descheduled peer is waited for)")
    add("--validate", action="store_true",
        help="also run each strategy for real here (one P) and print predicted vs measured")
    add("--epochs", type=int, default=3, help="--validate: epochs per run (default 3)")
    add("--repeats", type=int, default=1,
        help="--validate: runs per strategy; the fastest is compared (default 1)")
    add("--data-dir", default="data", help="--validate: where the data set's files are")
    add("--real-nodes", action="store_true",
        help="--validate: the runs take MPI's nodes (hosts, as on a cluster) instead of "
             "--ranks-per-node virtual nodes, unbound; they must come out P x G")
    add("--mpiexec-args", default=None, metavar="ARGS",
        help="--validate: extra mpiexec arguments that place the ranks, one string (e.g. "
             "'-hosts a:2,b:2'; default $MINIDP_MPIEXEC_ARGS, which tests/hosts_cli.py "
             "shell sets)")
    return parser


def describe(args: argparse.Namespace, s: Setup) -> str:
    """The header: model, what was measured, the node, the network and its rule."""
    g, node = args.ranks_per_node, s.node
    lines = [
        f"simulate: {args.model} on {args.dataset} {DATASETS[args.dataset][0]}, "
        f"{s.params:,} parameters ({s.nbytes / 1e6:.2f} MB {args.dtype}), batch "
        f"{args.batch_size} per rank, {s.samples:,} samples per epoch",
        f"one core: step {node.step_s * 1e3:.2f} ms{' (given)' if args.step_ms else ''}, "
        f"memory sweep {1e-9 / node.byte_s:.1f} GB/s{' (given)' if args.mem_gbps else ''}; "
        f"sync point {node.sync_s * 1e6:g} us{' (given)' if args.sync_us is not None else ''}",
        f"node: {g} rank(s) on {node.cores:g} core(s) (compute x{node.share:.2f}); network "
        f"{args.net_latency_us:g} us + {args.net_bandwidth_gbps or 'unlimited'} Gbit/s per "
        f"link, {'one link per rank' if s.links is None else f'{s.links:g} per node'}; "
        f"rule {s.rule}"]
    if s.rule == "mpich":
        world, p = s.nodes[-1] * g, s.nodes[-1]
        lines.append(f"MPICH Iallreduce at P={p}: world ({world} ranks, {s.nbytes:,} B) "
                     f"{mpich_algorithm(world, s.nbytes, s.itemsize)}; rail ({p} ranks, "
                     f"{s.nbytes:,} B whole, {s.nbytes // g:,} B slice) "
                     f"{mpich_algorithm(p, s.nbytes / g, s.itemsize)}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Measure here, predict for every P and strategy, print the table; 0 on success."""
    s = setup(args)
    print(describe(args, s), flush=True)
    results: dict[str, list[tuple[int, Epoch]]] = {}
    for p in s.nodes:
        for epoch in s.predict(p, args):
            results.setdefault(epoch.label, []).append((p, epoch))
    rows = []
    for series in results.values():
        for i, (p, e) in enumerate(series):
            ranks = p * args.ranks_per_node
            step = e.seconds / e.batches
            rows.append([e.label, str(p), str(ranks), str(e.batches), f"{step * 1e3:.2f}",
                         f"{e.comm_s / e.batches * 1e3:.2f}", f"{e.comm_share:.0%}",
                         f"{e.seconds:.3f}", f"{ranks * args.batch_size / step:,.0f}",
                         f"{speedup(series, i):.2f}x"])
    print()
    print(table(["strategy", "nodes", "ranks", "batches", "step ms", "comm ms", "comm %",
                 "epoch s", "samples/s", "speed-up"], rows))
    if len(s.nodes) > 1:
        print()
        for series in results.values():
            print(scaling(series))
    if args.validate:
        from minidp.simulate.validate import JobFailed, compare, comparison_table

        print()
        try:
            print(comparison_table(compare(args, s)), flush=True)
        except JobFailed as failed:  # one line: which run, its status and its last line
            print(f"error: {failed}", file=sys.stderr, flush=True)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m minidp.simulate``: the subcommand on its own."""
    from minidp.run import environment

    parser = add_arguments(argparse.ArgumentParser(prog="python -m minidp simulate",
                                                   description=__doc__.splitlines()[0]))
    args = parser.parse_args(argv)
    try:
        environment.check()
        return run(args)
    except (ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
