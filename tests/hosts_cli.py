"""Real hosts on this machine from the shell: bring them up, run a job across them, tear down.

    sudo .venv/bin/python tests/hosts_cli.py check
    sudo .venv/bin/python tests/hosts_cli.py run --hosts 2 --ranks-per-host 2 -- \\
        .venv/bin/python -m mpi4py -m minidp train --strategy hsgd ...
    sudo .venv/bin/python tests/hosts_cli.py shell --hosts 2 --ranks-per-host 2 \\
        --cores-per-host 1 -- .venv/bin/python -m minidp simulate ... --validate --real-nodes
    sudo .venv/bin/python tests/hosts_cli.py timing --hosts 1 2 4 --repeat 5
    sudo .venv/bin/python tests/hosts_cli.py cleanup [--prefix mh] [--force]

``run`` puts ``mpiexec`` and its placement in front of the command, prints the hosts, the
mpiexec line and the bytes each link carried, and exits with mpiexec's status (3: no
hosts possible here, 2: no command). ``shell`` runs the command as it is, with
``$MINIDP_MPIEXEC_ARGS`` holding the placement (``simulate --validate --real-nodes``
reads it). Both tear the hosts down in every case, SIGTERM and Ctrl-C included.
``make hosts`` runs a demo job with ``run`` (see the Makefile).
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import time

from hosts import Hosts, available
from hosts_names import FAMILY, cleanup_stale

from minidp.reporting.launcher import mpiexec

NOT_AVAILABLE = 3
MPIEXEC_ARGS_ENV = "MINIDP_MPIEXEC_ARGS"


def host_cpus(hosts: int, cores_per_host: int | None) -> list[list[int]] | None:
    """The CPUs of each host: consecutive blocks of this process's CPUs, or None (all)."""
    if cores_per_host is None:
        return None
    mine = sorted(os.sched_getaffinity(0))
    if cores_per_host < 1 or hosts * cores_per_host > len(mine):
        raise ValueError(f"--cores-per-host: got {cores_per_host}, allowed: 1 to "
                         f"{len(mine) // hosts} ({len(mine)} CPUs here for {hosts} hosts)")
    return [mine[i * cores_per_host:(i + 1) * cores_per_host] for i in range(hosts)]


def _raise_on_signal(signum, frame):
    """SIGTERM/SIGHUP as SystemExit, so that the hosts are torn down."""
    raise SystemExit(128 + signum)


def _up(args) -> Hosts:
    """Start the hosts of ``args`` and print what they are."""
    hosts = Hosts(args.hosts, cpus=host_cpus(args.hosts, args.cores_per_host),
                  clean_env=not args.inherit_env).start()
    cpus = f", cpus {hosts.cpus}" if hosts.cpus else ""
    print(f"hosts: {', '.join(f'{n}={a}' for n, a in hosts.addresses.items())}; bridge "
          f"{hosts.bridge}={hosts.bridge_address}{cpus} (set-up {hosts.timings['setup']:.3f} s)",
          flush=True)
    return hosts


def _down(hosts: Hosts) -> None:
    hosts.close()
    left = f"; LEFT BEHIND: {hosts.leftovers}" if hosts.leftovers else ""
    print(f"tear-down {hosts.timings.get('teardown', 0):.3f} s{left}", file=sys.stderr,
          flush=True)


def run_or_shell(args) -> int:
    """``run`` (mpiexec COMMAND across the hosts) and ``shell`` (COMMAND given the placement)."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print(f"hosts_cli.py {args.cmd}: no command (put it after --)", file=sys.stderr)
        return 2
    ok, why = available()
    if not ok:
        print(f"hosts_cli.py: no real hosts here: {why}", file=sys.stderr)
        return NOT_AVAILABLE
    env = dict(os.environ)
    if args.timeout:
        env["MPIEXEC_TIMEOUT"] = str(args.timeout)
    hosts = _up(args)
    try:
        before = {name: hosts.link_bytes(name) for name in hosts.names}
        if args.cmd == "run":
            argv = [mpiexec(), *hosts.mpiexec_args(args.ranks_per_host, env=env), *command]
        else:
            argv = command
            env[MPIEXEC_ARGS_ENV] = shlex.join(hosts.mpiexec_args(args.ranks_per_host,
                                                                  count=False, env=env))
            print(f"{MPIEXEC_ARGS_ENV}={shlex.quote(env[MPIEXEC_ARGS_ENV])}", flush=True)
        print(f"+ {shlex.join(argv)}", flush=True)
        t0 = time.perf_counter()
        status = subprocess.run(argv, env=env).returncode
        seconds = time.perf_counter() - t0
        for name in hosts.names:
            after = hosts.link_bytes(name)
            print(f"link {name}: sent {after['tx'] - before[name]['tx']:,} B, received "
                  f"{after['rx'] - before[name]['rx']:,} B", flush=True)
        print(f"exit status: {status} ({seconds:.2f} s)", flush=True)
    finally:
        # Also on SIGTERM/SIGHUP (SystemExit) and Ctrl-C: subprocess.run has killed the
        # command by then, and close() kills whatever is left in the hosts.
        _down(hosts)
    return status


def timing(args) -> int:
    """``timing``: seconds to set up and tear down N hosts, repeated."""
    for n in args.hosts:
        runs = []
        for _ in range(args.repeat):
            with Hosts(n) as hosts:
                pass
            runs.append((hosts.timings["setup"], hosts.timings["teardown"]))
        for i, what in enumerate(("set-up", "tear-down")):
            values = sorted(r[i] for r in runs)
            print(f"{n} host(s): {what} median {values[len(values) // 2]:.3f} s (min "
                  f"{values[0]:.3f}, max {values[-1]:.3f}; {args.repeat} runs)", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run the subcommand; returns the exit status."""
    parser = argparse.ArgumentParser(prog="hosts_cli.py", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check", help="say whether hosts can be made here, and if not why")
    for name, text in (("run", "run `mpiexec PLACEMENT COMMAND` across N hosts"),
                       ("shell", f"run COMMAND with ${MPIEXEC_ARGS_ENV} = the placement")):
        one = sub.add_parser(name, help=text)
        one.add_argument("--hosts", type=int, default=2)
        one.add_argument("--ranks-per-host", type=int, default=2)
        one.add_argument("--cores-per-host", type=int, default=None,
                         help="confine host i to the i-th block of this many CPUs")
        one.add_argument("--timeout", type=int, help="MPIEXEC_TIMEOUT in seconds")
        one.add_argument("--inherit-env", action="store_true",
                         help="proxies inherit this environment instead of a login one")
        one.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    times = sub.add_parser("timing", help="time set-up and tear-down")
    times.add_argument("--hosts", type=int, nargs="+", default=[2])
    times.add_argument("--repeat", type=int, default=5)
    clean = sub.add_parser("cleanup", help="remove what killed runs left")
    clean.add_argument("--prefix", default=FAMILY)
    clean.add_argument("--force", action="store_true", help="also instances still running")
    args = parser.parse_args(argv)

    signal.signal(signal.SIGTERM, _raise_on_signal)
    signal.signal(signal.SIGHUP, _raise_on_signal)
    if args.cmd == "check":
        ok, why = available()
        print(why)
        return 0 if ok else 1
    if args.cmd in ("run", "shell"):
        try:
            return run_or_shell(args)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.cmd == "timing":
        return timing(args)
    removed = cleanup_stale(args.prefix, force=args.force)
    print("\n".join(removed) if removed else "nothing to remove")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # mpiexec got it too, and the hosts are torn down by now
        sys.exit(130)
