"""How long a new ``minidp train`` process is unprotected against a stop signal.

    .venv/bin/python benchmarks/bench_signal_window.py [--repeat N] [--burn K] [--code DIR]

From the moment a process is started (``fork`` and ``exec``) until its handler for
SIGTERM is in place, SIGTERM (and SIGUSR1) has its default action: the rank dies, and
its launcher ends the job. The window is read from outside, as a scheduler would see it:
the process is started, and its ``SigCgt`` mask in ``/proc/PID/status`` (the signals it
catches) is polled until SIGTERM's bit appears. Each of the three ways of starting
``minidp train`` is measured ``--repeat`` times (the process is then killed: only its
start matters); ``--burn K`` runs K busy processes meanwhile (one per core is the
"loaded machine" of docs/reliability.md); ``--code DIR`` measures the minidp found in
DIR instead (an older checkout, for a before/after comparison). Prints the median and
the largest window of each, and the same for ``python -c pass`` (Python's own start-up,
which no package can shorten).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
ENTRIES = {
    "python -m minidp train": [sys.executable, "-m", "minidp", "train", "--help"],
    "python -m mpi4py -m minidp train": [sys.executable, "-m", "mpi4py", "-m", "minidp",
                                         "train", "--help"],
    "minidp train (console script)": [os.path.join(BIN, "minidp"), "train", "--help"],
}


def catches_sigterm(pid: int) -> bool | None:
    """Whether ``pid`` catches SIGTERM now; None once the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    except (OSError, StopIteration):
        return None
    return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)


def window(command: list[str], code: str) -> float:
    """Seconds from starting ``command`` to its SIGTERM handler being in place.

    It runs in ``code`` with ``code`` on PYTHONPATH: ``python -m`` puts the working
    directory first on its path, the console script its own directory.
    """
    env = dict(os.environ, PYTHONPATH=code)
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, cwd=code, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        while True:
            state = catches_sigterm(proc.pid)
            if state:
                return time.perf_counter() - start
            if state is None or proc.poll() is not None:
                raise RuntimeError(f"{command}: ended before it caught SIGTERM")
    finally:
        proc.kill()
        proc.wait()


def burn() -> None:
    """A busy process: what another job does with a core."""
    while True:
        pass


def main() -> int:
    """Measure every entry; print median and largest window."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--burn", type=int, default=0, help="busy processes meanwhile")
    parser.add_argument("--code", default=HERE, help="the checkout whose minidp is measured")
    args = parser.parse_args()
    code = os.path.abspath(args.code)
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(args.burn)]
    for b in burners:
        b.start()
    try:
        baseline = [sys.executable, "-c", "import signal, time; "
                    "signal.signal(signal.SIGTERM, print); time.sleep(60)"]
        for name, command in [("python -c (no package)", baseline), *ENTRIES.items()]:
            seconds = sorted(window(command, code) for _ in range(args.repeat))
            print(f"{name:34s} median {statistics.median(seconds) * 1e3:7.1f} ms, largest "
                  f"{seconds[-1] * 1e3:7.1f} ms ({args.repeat} starts, {args.burn} busy "
                  "processes)", flush=True)
    finally:
        for b in burners:
            b.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
