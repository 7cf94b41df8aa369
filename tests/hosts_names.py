"""What the real hosts of ``tests/hosts.py`` are called, and removing what dead runs left.

Every name an instance creates starts with its prefix, ``mh`` + 6 hex digits of the owning
process's pid + 2 of a per-process counter, then ``br`` (the bridge, and each host's
interface), ``vI`` (the root side of host I's veth), ``hI`` (host I's namespace and
hostname) or ``pr`` (the probe of ``available``); Linux allows 15 characters. A killed
test (SIGKILL cannot be caught) leaves them behind: :func:`cleanup_stale` removes the
instances whose pid is dead and leaves live ones (a run beside it) alone.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

FAMILY = "mh"
IFNAMSIZ = 15
MAX_HOSTS = 64
WORKDIR_PREFIX = "minidp-hosts-"
# The variable naming the link-counter service's socket in a job (tests/hosts.py).
COUNTERS_ENV = "MINIDP_HOSTS_COUNTERS"
_DEFAULT_PREFIX = re.compile(rf"^{FAMILY}([0-9a-f]{{6}})([0-9a-f]{{2}})$")
_SUFFIX = r"(br|v\d+|h\d+|pr)"

_counter = itertools.count(random.randrange(256))


def new_prefix() -> str:
    """A prefix unique to this process and instance.

    The pid tells a dead process's leftovers from a live instance; the last byte, a
    counter from a random start, tells apart one process's instances and those of a pid
    reused by a later process.
    """
    return f"{FAMILY}{os.getpid() & 0xFFFFFF:06x}{next(_counter) % 256:02x}"


def tool(name: str) -> str | None:
    """Absolute path of a system tool, also where PATH lacks the sbin directories."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def run_tool(args: list[str], check: bool = True, timeout: float = 30) -> \
        subprocess.CompletedProcess:
    """Run a command, capturing its output; raise with its stderr when ``check`` and it fails."""
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def link_names(ip: str) -> set[str]:
    """Names of the links in the root namespace (without the ``@peer`` suffix)."""
    out = run_tool([ip, "-o", "link", "show"], check=False).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def remove_hydra_topology_files(owned: Callable[[str], bool]) -> list[str]:
    """Remove the hwloc files of Hydra proxies that ran on the hosts ``owned`` accepts.

    Each proxy writes /tmp/hydra_hwloc_xmlfile_XXXXXX (a path fixed in Hydra, whatever
    TMPDIR says) and removes it only when it exits normally: a killed or timed-out job
    leaves one per host in the shared /tmp. The file names the hostname it was written
    on, which tells ours from other jobs'. Returns the paths removed.
    """
    removed = []
    for path in Path("/tmp").glob("hydra_hwloc_xmlfile_*"):
        try:
            with open(path, errors="replace") as f:
                head = f.read(8192)
        except OSError:
            continue
        match = re.search(r'name="HostName" value="([^"]*)"', head)
        if match and owned(match.group(1)):
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(str(path))
    return removed


def remove_openmpi_session_dirs(owned: Callable[[str], bool]) -> list[str]:
    """Remove the session directories of Open MPI daemons that ran on the hosts ``owned``
    accepts.

    Each ``orted`` makes ``ompi.HOST.UID`` in the shared /tmp (its TMPDIR is a login's:
    none) and removes its part as it exits, but not when it is killed with its host. The
    directory is named by the host's name, which tells ours from other jobs'. Returns the
    paths removed.
    """
    removed = []
    for path in Path("/tmp").glob(f"ompi.*.{os.getuid()}"):
        host = path.name[len("ompi."):].rsplit(".", 1)[0]
        if path.is_dir() and owned(host):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_stale(prefix: str = FAMILY, force: bool = False) -> list[str]:
    """Remove what killed runs left: namespaces (and their processes), links, temp files.

    Args:
        prefix: ``mh`` for every default-named instance whose owning process is gone, or
            one instance's prefix, removed whatever its state.
        force: Also remove default-named instances whose owner still runs.

    Returns:
        What was removed, one line each.
    """
    ip = tool("ip")
    if ip is None:
        return []
    pattern = re.compile(rf"^({re.escape(prefix)}[0-9A-Za-z]*?){_SUFFIX}$")

    def stale(instance: str) -> bool:
        if force:
            return True
        match = _DEFAULT_PREFIX.match(instance)
        if match:
            return not _pid_alive(int(match.group(1), 16))
        return instance == prefix  # a custom prefix: the caller named this instance

    def mine(name: str) -> re.Match | None:
        match = pattern.match(name)
        return match if match and stale(match.group(1)) else None

    removed = []
    namespaces = [n for n in run_tool([ip, "netns", "list"], check=False).stdout.split()
                  if mine(n)]
    for name in namespaces:
        for pid in run_tool([ip, "netns", "pids", name], check=False).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    # veths before bridges, then namespaces: the reverse of creation.
    for name in sorted(link_names(ip), key=lambda n: n.endswith("br")):
        if mine(name) and run_tool([ip, "link", "del", name], check=False).returncode == 0:
            removed.append(f"link {name}")
    for name in namespaces:
        if run_tool([ip, "netns", "del", name], check=False).returncode == 0:
            removed.append(f"netns {name}")

    def owned(host: str) -> bool:
        match = mine(host)
        return bool(match) and match.group(2).startswith("h")

    removed += [f"file {p}" for p in remove_hydra_topology_files(owned)]
    removed += [f"dir {p}" for p in remove_openmpi_session_dirs(owned)]
    for path in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}{prefix}*"):
        instance = path.name[len(WORKDIR_PREFIX):].split("-")[0]
        if path.is_dir() and stale(instance):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(f"dir {path}")
    return removed
