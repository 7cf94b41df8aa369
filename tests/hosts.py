"""Real hosts on one Linux machine, for MPI jobs launched by Hydra or mpirun (a test fixture).

Each host is a network namespace with its own UTS, IPC and mount namespace: its own
hostname, its own System V IPC and a private tmpfs on ``/dev/shm``. MPI then sees separate
nodes (``Split_type(COMM_TYPE_SHARED)`` gives one group per host, shared-memory windows are
per host) and every byte between hosts crosses a veth link over TCP. The veth pairs join a
bridge in the root namespace, which also holds an address: ``mpiexec`` runs there, and its
proxies call it back at that address. The file system (``/tmp``, the checkout, the venv) is
shared, as NFS is on a cluster.

MPICH's Hydra starts one ``hydra_pmi_proxy`` per host through its ``ssh`` launcher, Open
MPI's ``mpirun`` one ``orted`` through its ``rsh`` launcher; the program either is given
in place of ssh (``-launcher-exec``, ``--mca plm_rsh_agent``) is a shell script
(tests/hosts_wrapper.py): it takes ``[-x] HOST CMD...``, clears the environment as a
login would, enters the host's namespaces and runs CMD through ``sh -c``.
:meth:`Hosts.mpiexec_args` gives the launcher's own arguments (the one ``mpiexec()``
finds: ``spmd.launcher()``)::

    with Hosts(2) as hosts:
        subprocess.run([mpiexec, *hosts.mpiexec_args(ranks_per_host=2), python, "-m",
                        "mpi4py", "job.py"], check=True)

The command line is ``tests/hosts_cli.py``. Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN),
``ip`` (iproute2) and util-linux's ``unshare``; :func:`available` says why not otherwise.
Tear-down (:meth:`Hosts.close`, also at interpreter exit) kills what still runs in the
hosts, removes links, namespaces, the work directory and the files a killed launcher
leaks in the shared /tmp (Hydra's topology files, Open MPI's session directories), and
lists in ``leftovers`` whatever it could not remove. docs/reliability.md, "Two real hosts
on one machine", has the measurements and what this cannot show.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import random
import re
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from hosts_names import (
    COUNTERS_ENV,
    IFNAMSIZ,
    MAX_HOSTS,
    WORKDIR_PREFIX,
    link_names,
    new_prefix,
    remove_hydra_topology_files,
    remove_openmpi_session_dirs,
    run_tool,
    tool,
)
from hosts_wrapper import WRAPPER_TOOLS, write_launcher
from spmd import launcher, rank_of


def _lock_path() -> Path:
    """Where instances serialise the choice of subnet (shared by all of them on the machine)."""
    run_lock = Path("/run/lock")
    return (run_lock if run_lock.is_dir() else Path(tempfile.gettempdir())) / "minidp-hosts.lock"


def _used_networks(ip: str) -> list[ipaddress.IPv4Network]:
    """IPv4 networks already on this machine: every address's subnet and every route."""
    nets = []
    for line in run_tool([ip, "-4", "-o", "addr", "show"]).stdout.splitlines():
        fields = line.split()
        if "inet" in fields:
            nets.append(ipaddress.ip_interface(fields[fields.index("inet") + 1]).network)
    for line in run_tool([ip, "-4", "route", "show", "table", "all"]).stdout.splitlines():
        fields = line.split()
        if not fields:
            continue
        dest = fields[1] if fields[0] in ("local", "broadcast", "unicast") else fields[0]
        with contextlib.suppress(ValueError):
            if dest != "default":
                nets.append(ipaddress.ip_network(dest, strict=False))
    return nets


def available() -> tuple[bool, str]:
    """Whether `Hosts` can work on this machine: ``(True, "ok")`` or ``(False, why)``.

    Checks root and the tools, then does the real thing once in a throw-away namespace
    (a veth pair and a bridge inside it, new UTS, IPC and mount namespaces, a hostname, a
    tmpfs): sandboxes and containers often allow some of these and refuse others.
    """
    if not sys.platform.startswith("linux"):
        return False, f"needs Linux network namespaces (this is {sys.platform})"
    if os.geteuid() != 0:
        return False, "needs root (CAP_NET_ADMIN for links, CAP_SYS_ADMIN for namespaces)"
    tools = {name: tool(name) for name in WRAPPER_TOOLS}
    missing = [name for name, path in tools.items() if path is None]
    if missing:
        return False, f"missing tools: {', '.join(missing)} (iproute2, util-linux)"
    if not Path("/etc/hosts").exists():
        return False, "/etc/hosts is missing (each host bind-mounts its own over it)"
    ip, probe = tools["ip"], new_prefix() + "pr"
    try:
        run_tool([ip, "netns", "add", probe])
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        return False, f"`ip netns` not permitted here: {err}"
    try:
        run_tool([ip, "-n", probe, "link", "add", "pa", "type", "veth", "peer", "name", "pb"])
        run_tool([ip, "-n", probe, "link", "add", "pbr", "type", "bridge"])
        run_tool([ip, "netns", "exec", probe, tools["unshare"], "--uts", "--ipc", "--mount",
                  "--propagation", "private", tools["sh"], "-c",
                  "hostname probe && mount -t tmpfs tmpfs /dev/shm"])
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        return False, f"namespace set-up not permitted here: {err}"
    finally:
        run_tool([ip, "netns", "del", probe], check=False)  # its links go with it
    return True, "ok"


class _CounterHandler(socketserver.StreamRequestHandler):
    """Answers one connection with every host's link counters, as one JSON line."""

    def handle(self):
        hosts: Hosts = self.server.hosts  # type: ignore[attr-defined]
        payload = {"time": time.time(),
                   "links": {name: hosts.link_bytes(name) for name in hosts.names}}
        self.wfile.write((json.dumps(payload) + "\n").encode())


class Hosts:
    """N hosts, each a set of namespaces behind a veth link, for a launcher's ssh start-up.

    Entering builds everything, leaving tears everything down, also when the body raised.

    Attributes:
        names: Host names: the namespaces' names and the hosts' hostnames.
        bridge: Bridge in the root namespace (and the name of each host's interface).
        addresses: Host name -> IPv4 address (``.10 + i`` of a free 10.213.X.0/24).
        cpus: Host name -> the CPUs its processes are confined to (None: all).
        workdir: Temporary directory of the wrapper, the hosts files and the socket.
        timings: Seconds spent in set-up and tear-down.
        leftovers: What tear-down could not remove (empty when all went).
    """

    def __init__(self, n_hosts: int = 2, name_prefix: str | None = None,
                 cpus: list[list[int]] | None = None, clean_env: bool = True):
        """Describe the hosts; nothing is created before `start` (or ``with``).

        Args:
            n_hosts: How many hosts (1 to 64).
            name_prefix: Prefix of every name; default ``mh`` + pid + a counter, unique
                per instance, which `hosts_names.cleanup_stale` recognises.
            cpus: One list of CPU numbers per host: its proxy and ranks run on those
                only (``taskset``), as a machine's processes run on its own cores.
            clean_env: Start each proxy (orted) with a login-like environment, as ssh
                does (the job's environment then reaches the ranks only through the
                launcher); False lets them inherit the caller's.
        """
        if not 1 <= n_hosts <= MAX_HOSTS:
            raise ValueError(f"n_hosts: got {n_hosts}, allowed: 1 to {MAX_HOSTS}")
        self.prefix = name_prefix or new_prefix()
        room = IFNAMSIZ - 1 - len(str(n_hosts - 1))
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", self.prefix) or len(self.prefix) > room:
            raise ValueError(f"name_prefix: got {self.prefix!r}, allowed: letters and digits, "
                             f"at most {room} characters")
        if cpus is not None and (len(cpus) != n_hosts or not all(cpus)):
            raise ValueError(f"cpus: got {cpus!r}, allowed: {n_hosts} non-empty lists")
        self.names = [f"{self.prefix}h{i}" for i in range(n_hosts)]
        self.bridge = f"{self.prefix}br"
        self.cpus = dict(zip(self.names, cpus)) if cpus else None
        self.clean_env = clean_env
        self.bridge_address = ""
        self.addresses: dict[str, str] = {}
        self.workdir: Path | None = None
        self.wrapper: Path | None = None
        self.timings: dict[str, float] = {}
        self.leftovers: list[str] = []
        self._ip = tool("ip")
        self._server: socketserver.UnixStreamServer | None = None
        self._started = False

    def veth(self, host: str | int) -> str:
        """Root-namespace side of a host's veth (its counters are the host's link)."""
        return f"{self.prefix}v{self._index(host)}"

    def _index(self, host: str | int) -> int:
        if isinstance(host, int):
            if not 0 <= host < len(self.names):
                raise IndexError(f"host: got {host}, allowed: 0 to {len(self.names) - 1}")
            return host
        if host not in self.names:
            raise KeyError(f"host: got {host!r}, allowed: {', '.join(self.names)}")
        return self.names.index(host)

    # -- life cycle ----------------------------------------------------------------------

    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> Hosts:
        """Create the bridge, the hosts, their links, the wrapper and the counter service.

        On any failure, what was already created is torn down before the error propagates.
        """
        if self._started:
            return self
        if self._ip is None:
            raise RuntimeError("`ip` (iproute2) not found")
        self._started = True
        # Before the first resource exists: a failure half way, or a caller that forgets
        # `close`, still leaves nothing behind.
        atexit.register(self.close)
        t0 = time.perf_counter()
        try:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{self.prefix}-"))
            self._create_bridge()
            for i, name in enumerate(self.names):
                self._create_host(i, name)
            self._write_files()
            self._start_counter_service()
        except BaseException:
            self.close()
            raise
        self.timings["setup"] = time.perf_counter() - t0
        return self

    def _create_bridge(self) -> None:
        """The bridge, with ``.1`` of a free /24 chosen and claimed under a machine-wide lock.

        The address is on the bridge, where the next instance sees it, before the lock is
        released: concurrent instances (parallel test runs) pick different subnets.
        """
        ip = self._ip
        with open(_lock_path(), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            used = _used_networks(ip)
            candidates = [ipaddress.ip_network(f"10.213.{x}.0/24") for x in range(1, 255)]
            random.shuffle(candidates)
            free = [net for net in candidates if not any(net.overlaps(u) for u in used)]
            if not free:
                raise RuntimeError("no free /24 left in 10.213.0.0/16")
            addresses = list(free[0].hosts())
            self.bridge_address = str(addresses[0])
            self.addresses = {name: str(addresses[9 + i]) for i, name in enumerate(self.names)}
            run_tool([ip, "link", "add", self.bridge, "type", "bridge"])
            # No IPv6 link-local address: router and neighbour solicitations would trickle
            # over the links and blur the byte counters a test compares.
            run_tool([ip, "link", "set", self.bridge, "addrgenmode", "none"])
            run_tool([ip, "addr", "add", f"{self.bridge_address}/24", "dev", self.bridge])
            run_tool([ip, "link", "set", self.bridge, "up"])

    def _create_host(self, i: int, name: str) -> None:
        """Host ``i``: its namespace and a veth pair from the bridge into it."""
        ip, veth, inner = self._ip, self.veth(i), self.bridge
        run_tool([ip, "netns", "add", name])
        # The host side is named as the bridge: Hydra passes `-iface BRIDGE` on to the
        # proxies (and to MPICH as MPIR_CVAR_NEMESIS_TCP_NETWORK_IFACE), which look for an
        # interface of that name on every host; Open MPI's `*_if_include` names it alike.
        run_tool([ip, "link", "add", veth, "type", "veth", "peer", "name", inner, "netns", name])
        run_tool([ip, "link", "set", veth, "addrgenmode", "none"])
        run_tool([ip, "-n", name, "link", "set", inner, "addrgenmode", "none"])
        run_tool([ip, "link", "set", veth, "master", self.bridge, "up"])
        run_tool([ip, "-n", name, "addr", "add", f"{self.addresses[name]}/24", "dev", inner])
        run_tool([ip, "-n", name, "link", "set", inner, "up"])
        # MPI and the proxy talk to themselves over loopback; a new namespace has it down.
        run_tool([ip, "-n", name, "link", "set", "lo", "up"])

    def _write_files(self) -> None:
        """One /etc/hosts per host, and the launcher wrapper."""
        self.wrapper = write_launcher(self.workdir, self.prefix, self.addresses, self.bridge,
                                      self.bridge_address, self.cpus, self.clean_env)

    def _start_counter_service(self) -> None:
        """Serve the link counters on a Unix socket, for jobs that bracket their own phases."""
        server = socketserver.ThreadingUnixStreamServer(str(self.workdir / "counters.sock"),
                                                        _CounterHandler)
        server.daemon_threads = True
        server.hosts = self  # type: ignore[attr-defined]
        # `shutdown` waits for the loop's next turn: 0.5 s by default, most of a tear-down.
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02},
                         name=f"{self.prefix}-counters", daemon=True).start()
        self._server = server

    def close(self) -> None:
        """Tear everything down; safe to call twice, and after a failed `start`.

        Processes still in a host (a stopped rank, or a proxy that lost its mpiexec) are
        killed first: they would keep the namespace, its tmpfs and its link alive. Every
        step runs whatever the previous ones did; what remains is listed in `leftovers`
        and reported on stderr.
        """
        if not self._started:
            return
        self._started = False
        atexit.unregister(self.close)
        t0 = time.perf_counter()
        ip = self._ip
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        namespaces = set(run_tool([ip, "netns", "list"], check=False).stdout.split())
        for name in self.names:
            if name in namespaces:
                self._kill_processes(name)
        for i in range(len(self.names)):
            run_tool([ip, "link", "del", self.veth(i)], check=False)  # both ends go
        run_tool([ip, "link", "del", self.bridge], check=False)
        for name in self.names:
            if name in namespaces:
                run_tool([ip, "netns", "del", name], check=False)
        if self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
        remove_hydra_topology_files(lambda host: host in self.names)
        remove_openmpi_session_dirs(lambda host: host in self.names)
        self.leftovers = self._remaining()
        self.timings["teardown"] = time.perf_counter() - t0
        if self.leftovers:
            print(f"tests/hosts.py: could not remove: {', '.join(self.leftovers)}",
                  file=sys.stderr)

    def _kill_processes(self, name: str, wait: float = 5.0) -> None:
        """SIGKILL every process in a host's network namespace; wait until they are gone."""
        for pid in self.pids(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + wait
        while self.pids(name) and time.monotonic() < deadline:
            time.sleep(0.02)

    def _remaining(self) -> list[str]:
        """Names of this instance still present in the root namespace."""
        namespaces = set(run_tool([self._ip, "netns", "list"], check=False).stdout.split())
        mine = {self.bridge, *self.names, *(self.veth(i) for i in range(len(self.names)))}
        left = sorted(mine & (link_names(self._ip) | namespaces))
        if self.workdir is not None and self.workdir.exists():
            left.append(str(self.workdir))
        return left

    # -- use -----------------------------------------------------------------------------

    def pids(self, host: str | int) -> list[int]:
        """Pids of the processes inside a host (its proxy and ranks)."""
        name = self.names[self._index(host)]
        out = run_tool([self._ip, "netns", "pids", name], check=False)
        return [int(p) for p in out.stdout.split()]

    def rank_pids(self, host: str | int) -> dict[int, int]:
        """World rank -> pid of the MPI ranks running on a host (from their launcher's
        environment: PMI_RANK, OMPI_COMM_WORLD_RANK)."""
        ranks = {pid: rank_of(pid) for pid in self.pids(host)}
        return {rank: pid for pid, rank in ranks.items() if rank is not None}

    def mpiexec_args(self, ranks_per_host: int, count: bool = True,
                     env: dict[str, str] | None = None) -> list[str]:
        """The arguments that put an ``mpiexec`` job on these hosts, ranks in blocks.

        Ranks 0..G-1 go to the first host, G..2G-1 to the second, and so on. Follow
        them with the program and its arguments; ``count=False`` leaves out ``-n N``
        (for a caller that gives its own). ``env`` is the environment the launcher will
        run with (default this process's): Hydra passes all of it to the ranks, Open MPI
        only the variables named (``-x NAME`` for each of ``env``'s).
        """
        if not self.wrapper:
            raise RuntimeError("hosts not started")
        if launcher() == "openmpi":
            return self._mpirun_args(ranks_per_host, count, os.environ if env is None else env)
        return [
            "-launcher", "ssh", "-launcher-exec", str(self.wrapper),
            # Proxies find mpiexec at this interface's address; without it they are told
            # the machine's name, which is loopback inside a namespace.
            "-iface", self.bridge,
            # Hydra's default, said out loud: the job's environment reaches the ranks
            # through Hydra; the wrapper passes nothing.
            "-genvall",
            "-genv", COUNTERS_ENV, str(self.workdir / "counters.sock"),
            "-hosts", ",".join(f"{name}:{ranks_per_host}" for name in self.names),
        ] + (["-n", str(len(self.names) * ranks_per_host)] if count else [])

    def _mpirun_args(self, ranks_per_host: int, count: bool, env: dict[str, str]) -> list[str]:
        """:meth:`mpiexec_args` for Open MPI's ``mpirun``."""
        # Each host's interface is named as the bridge (see _create_host): the daemons'
        # out-of-band channel and the ranks' TCP transport take that one, on every host
        # and at mpirun, so every byte between hosts crosses the veth link.
        iface = self.bridge
        forwarded = [arg for name in sorted(env) if name != COUNTERS_ENV
                     for arg in ("-x", name)]
        return [
            "--mca", "plm_rsh_agent", str(self.wrapper),
            # mpirun starts every daemon itself (no daemon starts another from inside a
            # host: the wrapper runs in the root namespace).
            "--mca", "plm_rsh_no_tree_spawn", "1",
            "--mca", "oob_tcp_if_include", iface, "--mca", "btl_tcp_if_include", iface,
            # The hosts share this machine's cores: each orted sees all of them, and a
            # binding per host would pile the ranks of both hosts onto the same cores.
            "--bind-to", "none", "--map-by", "slot",
            *forwarded, "-x", f"{COUNTERS_ENV}={self.workdir / 'counters.sock'}",
            "--host", ",".join(f"{name}:{ranks_per_host}" for name in self.names),
        ] + (["-n", str(len(self.names) * ranks_per_host)] if count else [])

    def link_bytes(self, host: str | int) -> dict[str, int]:
        """Bytes and packets a host has sent (``tx``) and received (``rx``) over its link.

        Read in the root namespace from the host's veth, whose receive side is what the
        host sent; two readings bracket what crossed in between.
        """
        stats = Path("/sys/class/net") / self.veth(host) / "statistics"

        def read(counter: str) -> int:
            return int((stats / counter).read_text())

        return {"tx": read("rx_bytes"), "rx": read("tx_bytes"),
                "tx_packets": read("rx_packets"), "rx_packets": read("tx_packets")}


def request_link_bytes(path: str | None = None, timeout: float = 10.0) -> dict:
    """From inside a job: every host's link counters now, from the parent's service.

    A namespace's /sys shows its own links only, so the parent serves the root
    namespace's counters on the Unix socket named by ``$MINIDP_HOSTS_COUNTERS``.

    Returns:
        ``{"time": ..., "links": {host: {"tx": ..., "rx": ..., ...}}}`` (see `link_bytes`).
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path or os.environ[COUNTERS_ENV])
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    return json.loads(data)
