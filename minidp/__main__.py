"""Command line: ``python -m minidp train|info|data|report|compare|simulate|replay``.

``train`` one distributed run; ``info`` versions, MPI, backend, threads, BLAS; ``data prepare``
a dataset's files; ``report`` report.md and plots of run directories; ``compare`` several
strategies trained alike, then reported; ``simulate`` epoch times predicted at cluster
scale; ``replay`` an asynchronous run re-executed and compared with its model.

Run distributed jobs under ``mpiexec -n N python -m mpi4py -m minidp train ...`` or,
installed, ``mpiexec -n N minidp train ...`` (the console script does what ``-m mpi4py``
does); without either, minidp installs its own hook, so an exception on one rank still
aborts every rank. A user error (bad flag or setting, refused --out or --resume, bad
``MINIDP_*`` variable, a file that cannot be written) is one line ``error: ...`` with exit
status 2: printed once, by rank 0, when every rank has the same error, and the job ends
normally (MPI finalised, no abort banner, nothing left in ``/dev/shm``); else printed by
each rank, and the job is aborted. Every command but ``info`` checks the ``MINIDP_*``
variables first (:mod:`minidp.run.environment`); ``info`` shows what is wrong instead.

Exit status: 0 done; 2 a user error; 3 stopped by SIGTERM, SIGUSR1 or SIGINT (Ctrl-C)
(:data:`minidp.run.stopping.EXIT_STOPPED`): with a checkpoint, resume it with
``--resume``, or before the first batch, with nothing to resume; 4 the run diverged (a
loss, gradient or parameter not finite, :data:`EXIT_DIVERGED`): resume the last
checkpoint with a lower ``--lr``. A process started as ``minidp train`` catches the stop
signals in the package's first statement, before NumPy and MPI load
(:mod:`minidp.run.signals`).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from typing import TYPE_CHECKING

import minidp
from minidp.run import collector
from minidp.run.signals import catch_stop_signals

if TYPE_CHECKING:
    from mpi4py import MPI

EXIT_DIVERGED = 4  # a loss, gradient or parameter not finite: resume with a lower --lr


class ArgumentsRefused(ValueError):
    """argparse's complaint, raised instead of printed and exited on every rank."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are exceptions, reported as one line.

    Every rank has the same one, so rank 0 prints it once and the job ends normally
    (argparse's own exit on every rank printed it N times, and ``python -m mpi4py``
    aborted the job).
    """

    def error(self, message: str) -> None:  # noqa: D102 (argparse's hook)
        raise ArgumentsRefused(f"{message} (see {self.prog} --help)")


def info(_: argparse.Namespace) -> int:
    """Print versions, MPI library, this rank's host, the job's machines, backend, threads, BLAS.

    Under ``mpiexec`` every rank prints; ``machines`` (collective) lists MPI's
    shared-memory nodes of the job with their hosts and ranks: the nodes a run without
    ``--ranks-per-node`` takes.
    """
    import numba
    from mpi4py import MPI

    from minidp import threads
    from minidp.comm import mpi_library, versions
    from minidp.comm.topology import machines
    from minidp.kernels import blas
    from minidp.run import environment

    report = {
        **versions(), "numba": numba.__version__,
        "numba_jit": not numba.config.DISABLE_JIT,
        "mpi_library": mpi_library(),
        "mpi_world_size": MPI.COMM_WORLD.Get_size(), "mpi_rank": MPI.COMM_WORLD.Get_rank(),
        "host": MPI.Get_processor_name(), "machines": machines(MPI.COMM_WORLD),
        "backend": minidp.backend.describe(),
        "gpu": minidp.backend.gpu_info(), "threads": threads.thread_info(),
        "blas": blas.blas_info(),
    }
    try:
        environment.check()
    except ValueError as exc:
        report["environment"] = str(exc)  # shown, not refused: info is where one looks
    print(json.dumps(report, indent=2))
    return 0


def data_prepare(args: argparse.Namespace) -> int:
    """Convert a data set into NAME-train.mdp (shuffled once) and NAME-test.mdp under --out.

    The same preparation as a run's automatic one (:func:`minidp.io.prepare_dataset`).
    """
    from minidp.io import prepare_dataset
    from minidp.io.mdp import read_header

    for path in prepare_dataset(args.name, args.out, source_dir=args.data_dir,
                                progress=not args.quiet):
        header = read_header(path)
        print(f"{path}: {header.count} records of {header.record_size} bytes"
              f"{' (shuffled once)' if header.shuffled else ''}")
    return 0


AGREE_S = 5.0  # how long a failed rank waits to learn whether every rank failed alike


def report_error(exc: BaseException, errors: MPI.Comm, status: int = 2) -> int:
    """Print a user error once if every rank of ``errors`` has it, else per rank and abort.

    Every failed rank enters a barrier on ``errors`` (a communicator of its own, so it
    cannot meet another collective); if all ranks arrive within :data:`AGREE_S` seconds,
    their messages are compared without the ``rank N:`` prefix and rank 0 prints the
    common one. Otherwise (one rank failed, or they differ) each prints its own and a job
    of several ranks is aborted, so no rank is left waiting. The comparison waits
    :data:`AGREE_S` seconds, whatever ``--comm-timeout`` or ``MINIDP_COMM_TIMEOUT`` say
    (they may be the very error being reported). Returns the exit ``status``.
    """
    from minidp.comm import guard

    message = " ".join(str(exc).split("\n"))
    arrived, deadline = errors.Ibarrier(), time.monotonic() + AGREE_S
    while not arrived.Test():
        if time.monotonic() > deadline:
            break
        time.sleep(0.002)
    else:
        guard.set_timeout(AGREE_S)  # the job ends here: no later wait needs the user's
        try:
            common = {re.sub(r"^rank \d+: ", "", m) for m in
                      guard.allgather_object(errors, message, "compare error messages")}
        except guard.CommTimeout:
            common = set()
        if len(common) == 1:
            if errors.Get_rank() == 0:
                print(f"error: {common.pop()}", file=sys.stderr, flush=True)
            return finalized(status)
    print(f"error: {message}", file=sys.stderr, flush=True)
    if errors.Get_size() > 1:
        errors.Abort(status)
    return status


def finalized(status: int) -> int:
    """End MPI on every rank (collectively), then return ``status``.

    Under ``python -m mpi4py`` a non-zero exit status of a rank that has not finalised
    MPI aborts the job (a banner per rank, shared-memory files left behind); an outcome
    that every rank reaches alike is a normal end with that status instead. From here on
    the stop signals are ignored (:meth:`minidp.run.signals.Catcher.retire`): the run's
    outcome is decided and MPI's shared memory is gone.
    """
    from mpi4py import MPI

    from minidp.run.signals import CATCHER

    MPI.Finalize()
    if CATCHER.installed:  # minidp train: a signal now must not kill the exiting process
        CATCHER.retire()
    return status


def train(args: argparse.Namespace) -> int:
    """Run one training job (every rank); rank 0 prints epochs and the phase table."""
    from mpi4py import MPI

    from minidp.comm import guard
    from minidp.kernels import ensure_compiled
    from minidp.run import environment
    from minidp.run.files import phase_table
    from minidp.run.flags import from_args
    from minidp.run.stopping import EXIT_STOPPED, Stopped
    from minidp.run.trainer import Trainer

    collector.start_command()  # the modules of a train job are in: frozen, never walked
    guard.install_abort_hook()
    errors = MPI.COMM_WORLD  # until its duplicate exists
    rank = MPI.COMM_WORLD.Get_rank()
    try:
        environment.check()  # a bad MINIDP_* is a user error too, reported like a flag
        # A cold kernel cache takes a minute to fill (one rank per node, under a file
        # lock): before the first wait, so it never counts against --comm-timeout.
        ensure_compiled()
        guard.roll_call(MPI.COMM_WORLD, "start")  # a rank that never starts is named
        errors = guard.collective(MPI.COMM_WORLD, "start", MPI.COMM_WORLD.Dup)
        config = from_args(args)
        trainer = Trainer(config)
        if rank == 0:
            t = trainer.topology.describe()
            roles = f" ({t['servers']} server(s), {t['workers']} worker(s))" if t["servers"] \
                else ""
            print(f"minidp train: {config.strategy} on {t['world_size']} rank(s) = "
                  f"{t['num_nodes']} node(s) x {t['ranks_per_node']}{roles}, {config.model} on "
                  f"{config.dataset} ({trainer.batches} batches of {trainer.batch_size} per "
                  "worker per epoch)", flush=True)
        summary = trainer.fit()
    except Stopped as stop:
        if rank == 0:
            print(f"{stop} (exit status {EXIT_STOPPED})", file=sys.stderr, flush=True)
        return finalized(EXIT_STOPPED)
    except FloatingPointError as exc:
        return report_error(exc, errors, EXIT_DIVERGED)
    except (ValueError, TypeError, OSError) as exc:
        return report_error(exc, errors)
    if rank == 0:
        print(phase_table(summary["epochs"]))
        sent = summary["bytes_sent"]
        print(f"final test accuracy {summary['final']['test_accuracy']:.2%} after "
              f"{summary['wall_s']:.1f} s; bytes sent intra {sent['intra']:,}, inter "
              f"{sent['inter']:,}" + (f", MPI's allreduce (not split by node) {sent['mpi']:,}"
                                      if sent["mpi"] else ""), flush=True)
    return finalized(0)


def refused(exc: ArgumentsRefused, program: bool) -> int:
    """A command line argparse refused: one line (rank 0's, under MPI), exit status 2.

    ``program``: this process was started as the command (not ``main()`` called from
    Python, which carries on after the answer): only then is the refusal agreed by every
    rank and MPI ended, since under ``python -m mpi4py`` a non-zero exit of a rank that has
    not finalised MPI aborts the job.
    """
    from mpi4py import MPI

    if program and MPI.Is_initialized() and not MPI.Is_finalized():
        return report_error(exc, MPI.COMM_WORLD)
    print(f"error: {exc}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m minidp``."""
    program = argv is None
    argv = sys.argv[1:] if argv is None else list(argv)
    # Caught already when this process was started as `minidp train` (the package's first
    # statement); here for a `train` given to main() from Python, before MPI starts.
    catch_stop_signals(argv)
    from minidp.io.datasets import DATASETS

    parser = Parser(prog="python -m minidp", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, MPI, backend, threads, BLAS").set_defaults(run=info)
    from minidp.run.flags import build_parser

    train_parser = sub.add_parser("train", help="train a model with a distributed strategy")
    build_parser(train_parser).set_defaults(run=train)
    data = sub.add_parser("data", help="dataset files").add_subparsers(dest="action",
                                                                       required=True)
    prep = data.add_parser("prepare", help="write NAME-train.mdp and NAME-test.mdp")
    prep.add_argument("name", choices=DATASETS)
    prep.add_argument("--out", default="data", help="output directory (default data/)")
    prep.add_argument("--data-dir", default="data", help="where source files are looked for")
    prep.add_argument("--quiet", action="store_true", help="no progress bar")
    prep.set_defaults(run=data_prepare)
    # The other commands' parsers are filled in only when their command is given: their
    # modules (report's, simulate's, replay's: 23 modules, some 30 ms of each rank's
    # start) are not loaded otherwise. The help lists every command either way.
    later = {"report": "report.md and plots of runs",
             "compare": "train several strategies alike, then report",
             "simulate": "predicted epoch time and communication share at cluster scale",
             "replay": "re-execute an asynchronous run in one process; compare with its model"}
    chosen = argv[0] if argv else ""
    parsers = {name: sub.add_parser(name, help=text) for name, text in later.items()}
    if chosen in ("report", "compare"):
        from minidp.reporting import compare, report

        report.add_arguments(parsers["report"])
        compare.add_arguments(parsers["compare"])
    if chosen == "simulate":
        from minidp.simulate import command as simulate

        simulate.add_arguments(parsers["simulate"]).set_defaults(run=simulate.run)
    if chosen == "replay":
        from minidp.replay import command as replay

        replay.add_arguments(parsers["replay"]).set_defaults(run=replay.run)
    try:
        args = parser.parse_args(argv)
    except ArgumentsRefused as exc:
        return refused(exc, program)
    try:
        if args.command not in ("train", "info"):  # train checks inside its error report
            from minidp.run import environment

            environment.check()
        if args.command != "train":  # train's own modules load in train()
            collector.start_command()
        return args.run(args)
    except (ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file a command could not read or write: the path, the why
        where = f"'{exc.filename}': " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2


def console() -> None:
    """The ``minidp`` console script: ``python -m mpi4py -m minidp`` in one word.

    It installs minidp's abort hook before anything runs, so an uncaught exception on one
    rank prints that rank's traceback and aborts every rank, as ``-m mpi4py`` does.
    """
    catch_stop_signals(sys.argv[1:])  # usually caught already, by the package's first statement
    from minidp.comm import guard

    guard.install_abort_hook()
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
