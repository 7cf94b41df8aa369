r"""``python -m minidp compare``: train several strategies with the same flags, then report.

    python -m minidp compare --strategies sync,hsgd,daso,daso:global_sync=rail --out cmp \
        -- --model lenet5 --dataset fashion-mnist --epochs 5 --ranks-per-node 2

Each strategy runs as its own job (``MPIEXEC -n RANKS python -m mpi4py -m minidp train
FLAGS --strategy S --out OUT/S``), one after the other, so that they never share the
cores; then :mod:`minidp.reporting.report` writes ``OUT/report.md`` over all of them. A
``--set NAME.OPTION=VALUE`` goes only to the strategy it names (the others would refuse
it). A strategy written ``NAME:OPTION=VALUE[:OPTION=VALUE...]`` is a variant: the job
gets ``--set NAME.OPTION=VALUE`` for each, so one strategy can run with several
settings side by side. The train flags are checked once before anything is launched,
so a typo costs nothing; so are compare's own (``--timeout`` a finite number of seconds
> 0, ``--mpiexec`` a program that exists, ``--out`` a new or empty directory): one line
``error: compare: ...``, exit status 2. A job that fails is reported with its last
lines and left out of the report (exit status 1). A job past ``--timeout`` is ended
whole, leaving nothing behind: SIGTERM first (``train`` stops with a checkpoint), SIGKILL
after a grace period, then the shared-memory files its processes used are removed
(:func:`minidp.reporting.launcher.run_job`); Ctrl-C ends the running job the same way.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import shutil
import sys

from minidp.reporting.launcher import mpiexec, run_job
from minidp.reporting.report import check_plotting, write_report
from minidp.reporting.runs import label_runs, load_run
from minidp.strategies import STRATEGIES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``compare`` subcommand's arguments (the train flags follow, after ``--``)."""
    parser.add_argument("--strategies", required=True, metavar="S1,S2,...",
                        help=f"strategies to run, from: {', '.join(STRATEGIES)}; "
                             "S:OPTION=VALUE[:OPTION=VALUE] runs S with those options")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="a new directory: one run per strategy, and report.md")
    parser.add_argument("--ranks", type=int, default=4, help="ranks per job (default 4)")
    parser.add_argument("--mpiexec", default=None, help="the launcher (default: the "
                        "mpiexec beside this Python, else the one on PATH)")
    parser.add_argument("--timeout", type=float, default=3600,
                        help="seconds per job before it is killed (default 3600)")
    parser.add_argument("train_flags", nargs=argparse.REMAINDER,
                        help="flags for every `minidp train` job (after --)")
    parser.set_defaults(run=run)


def strategies_of(text: str) -> list[tuple[str, list[str]]]:
    """The comma-separated strategies, each (id, its ``--set`` flags), checked."""
    specs = [s.strip() for s in text.split(",") if s.strip()]
    variants = []
    for spec in specs:
        name, *options = spec.split(":")
        if name not in STRATEGIES:
            raise ValueError(f"compare: --strategies: got {name!r}, allowed: "
                             f"{', '.join(STRATEGIES)}")
        for option in options:
            if "=" not in option or not option.split("=", 1)[0]:
                raise ValueError(f"compare: --strategies: got {spec!r}, allowed: "
                                 f"{name}:OPTION=VALUE[:OPTION=VALUE...]")
        variants.append((name, [f for o in options for f in ("--set", f"{name}.{o}")]))
    if not variants:
        raise ValueError("compare: --strategies: got no strategy, allowed: a comma-"
                         "separated list such as sync,hsgd")
    return variants


def job_name(strategy: str, sets: list[str]) -> str:
    """The run directory's name part: the id, then each variant option."""
    return "-".join([strategy, *(s.split(".", 1)[1] for s in sets[1::2])])


def flags_for(strategy: str, flags: list[str]) -> list[str]:
    """The train flags with every ``--set`` of another strategy's option dropped."""
    kept: list[str] = []
    k = 0
    while k < len(flags):
        flag = flags[k]
        value = flags[k + 1] if flag == "--set" and k + 1 < len(flags) else None
        if value is not None:
            if value.split(".", 1)[0] == strategy:
                kept += [flag, value]
            k += 2
            continue
        kept.append(flag)
        k += 1
    return kept


def check_train_flags(strategies: list[tuple[str, list[str]]], flags: list[str]) -> None:
    """Parse each job's flags as `train` would, so a bad one fails before any launch."""
    from minidp.run.flags import check_command_line

    for flag in ("--strategy", "--out"):
        if flag in flags:
            raise ValueError(f"compare: train flags: {flag} is set by compare, allowed: "
                             "every other train flag")
    for strategy, sets in strategies:
        try:
            check_command_line([*flags_for(strategy, flags), *sets, "--strategy", strategy])
        except (ValueError, TypeError) as exc:
            raise ValueError(f"compare: train flags: {exc}") from None


def check_options(args: argparse.Namespace) -> None:
    """Refuse compare's own bad options (ValueError naming the option), before any job."""
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ValueError(f"compare: --timeout: got {args.timeout!r}, allowed: a finite number "
                         "of seconds > 0 (each job's)")
    if args.ranks < 1:
        raise ValueError(f"compare: --ranks: got {args.ranks}, allowed: an int >= 1")
    if args.mpiexec is not None and shutil.which(args.mpiexec) is None:
        raise ValueError(f"compare: --mpiexec: got {args.mpiexec!r}, allowed: a program that "
                         "exists and may be run (a path, or a name on PATH)")
    if os.path.lexists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"compare: --out: {args.out!r} is not a directory, allowed: a new or "
                         "empty directory")
    if os.path.isdir(args.out) and os.listdir(args.out):
        raise ValueError(f"compare: --out: {args.out!r} is not empty, allowed: a new or "
                         "empty directory")


def launcher(args: argparse.Namespace) -> str:
    """The mpiexec to use: the option, else :func:`mpiexec`."""
    return args.mpiexec or mpiexec()


def run(args: argparse.Namespace) -> int:
    """Train every strategy, then write the report; 1 if a job failed, 2 on bad input."""
    check_plotting()
    strategies = strategies_of(args.strategies)
    flags = args.train_flags[1:] if args.train_flags[:1] == ["--"] else args.train_flags
    check_options(args)
    check_train_flags(strategies, flags)
    done, failed = [], []
    for k, (strategy, sets) in enumerate(strategies):
        out = os.path.join(args.out, f"{k + 1:02d}-{job_name(strategy, sets)}")
        command = [launcher(args), "-n", str(args.ranks), sys.executable, "-m", "mpi4py",
                   "-m", "minidp", "train", *flags_for(strategy, flags), *sets,
                   "--strategy", strategy, "--out", out, "--no-progress"]
        print(f"$ {shlex.join(command)}", flush=True)
        try:
            status, output = run_job(command, args.timeout)
        except KeyboardInterrupt:  # run_job ended the job whole before this
            print(f"compare: interrupted; the {strategy} job was ended (no report written)",
                  file=sys.stderr, flush=True)
            return 130
        lines = output.strip().splitlines()
        # What the job warned of at its start (a DASO run that never cycles, an ignored
        # flag), then its last two lines: the final accuracy and time.
        told = [line for line in lines[:-2] if line.startswith(("warning:", "note:"))]
        print("\n".join([*told, *lines[-2:]]), flush=True)
        (done if status == 0 else failed).append(out)
        if status != 0:
            print(f"{strategy} failed (exit {status}); left out of the report",
                  file=sys.stderr, flush=True)
    if done:
        runs = [load_run(path) for path in done]
        label_runs(runs)
        print(f"wrote {write_report(runs, args.out)} ({len(runs)} run(s))")
    return 1 if failed else 0
