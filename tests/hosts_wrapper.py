"""The launcher side of tests/hosts.py: the stand-in for ssh, and each host's /etc/hosts.

Both launchers start their per-host process through ssh: Hydra's ``ssh`` launcher runs
``WRAPPER -x HOST "PROXY" ARGS...`` (its ``hydra_pmi_proxy``), Open MPI's ``rsh`` launcher
``WRAPPER HOST orted ARGS...`` (its daemon). The wrapper written here enters HOST as ssh
would enter a machine: a login environment (so that what the ranks see was passed by the
launcher), the host's network namespace with new UTS, IPC and mount namespaces (its
hostname, a private tmpfs on /dev/shm, its own /etc/hosts), then the command line
re-parsed by a shell, as a remote shell parses what ssh sends. Optionally the host's
processes are confined to its own CPUs (``taskset``).
"""

from __future__ import annotations

import os
import shlex
import socket
from pathlib import Path

from hosts_names import tool

# ssh gives a remote command a login environment, not the caller's: the wrapper does the
# same, so that whatever the ranks see was passed by the launcher (Hydra's -genvall, its
# default; Open MPI's -x NAME) and a job that works here also works with a real ssh.
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
WRAPPER_TOOLS = ("ip", "unshare", "mount", "hostname", "sh")


def write_launcher(workdir: Path, prefix: str, addresses: dict[str, str], bridge: str,
                   bridge_address: str, cpus: dict[str, list[int]] | None,
                   clean_env: bool) -> Path:
    """Write ``hosts.HOST`` for every host and the wrapper into ``workdir``; its path.

    Args:
        workdir: The instance's directory (on the file system every host shares).
        prefix: The instance's name prefix (named in the wrapper's header).
        addresses: Host name -> its address on the link.
        bridge: The bridge's name (each host's interface has it too).
        bridge_address: Where mpiexec listens for the proxies.
        cpus: Host name -> the CPUs its processes may use; None: all.
        clean_env: Start the proxies with a login environment (False: inherit mpiexec's).
    """
    # Inside a namespace the machine's /etc/hosts maps its own name to 127.0.0.1 and knows
    # no other host: each host gets a file naming all of them at their link addresses, as
    # a cluster's would. The machine's name maps to the bridge, where mpiexec listens
    # (Hydra tells the proxies to call back at that name when `-iface` is not given).
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
             f"{bridge_address}\t{bridge} {socket.gethostname()}"]
    lines += [f"{address}\t{name}" for name, address in addresses.items()]
    for name in addresses:
        (workdir / f"hosts.{name}").write_text("\n".join(lines) + "\n")
    wrapper = workdir / "ssh-wrapper.sh"
    wrapper.write_text(_wrapper_text(workdir, prefix, list(addresses), bridge, cpus, clean_env))
    wrapper.chmod(0o755)
    return wrapper


def _wrapper_text(workdir: Path, prefix: str, names: list[str], bridge: str,
                  cpus: dict[str, list[int]] | None, clean_env: bool) -> str:
    """The stand-in for ssh that a launcher runs as ``WRAPPER [-x] HOST CMD...``."""
    tools = {name: tool(name) for name in (*WRAPPER_TOOLS, "taskset")}
    needed = [n for n in WRAPPER_TOOLS + (("taskset",) if cpus else ()) if not tools[n]]
    if needed:
        raise RuntimeError(f"missing tools: {', '.join(needed)}")
    q = shlex.quote
    home = os.environ.get("HOME", "/root")
    user = os.environ.get("USER") or os.environ.get("LOGNAME") or "root"
    login = f"PATH={LOGIN_PATH} HOME={q(home)} USER={q(user)} LOGNAME={q(user)} SHELL=/bin/sh"
    start = f"env -i {login}" if clean_env else "env"
    if cpus:
        start += f' {q(tools["taskset"])} -c "$cpus"'
    cases = "\n".join(f"  {name}) cpus={','.join(map(str, cpus[name])) if cpus else ''} ;;"
                      for name in names)
    # Runs inside the host's new UTS, IPC and mount namespaces: the mounts belong to this
    # proxy and its ranks and vanish with them, so nothing needs unmounting.
    inner = (
        'host=$1; dir=$2; cmd=$3\n'
        f'{q(tools["hostname"])} "$host" || exit 255\n'
        f'{q(tools["mount"])} -t tmpfs -o mode=1777,nosuid,nodev tmpfs /dev/shm || exit 255\n'
        f'{q(tools["mount"])} --bind "$dir/hosts.$host" /etc/hosts || exit 255\n'
        # ssh hands the remote shell one string: re-parse it, which also strips the literal
        # quotes Hydra puts around the proxy's path and Open MPI around its URIs. Hydra's
        # is one command: the inner `exec` replaces the shell by the proxy, so that
        # Hydra's signals reach the proxy itself. Open MPI's is a short script (it sets
        # PATH and LD_LIBRARY_PATH, then starts orted), which only a shell can run.
        'case "$cmd" in\n'
        '  *";"*) exec /bin/sh -c "$cmd" ;;\n'
        '  *) exec /bin/sh -c "exec $cmd" ;;\n'
        'esac\n')
    return f"""#!/bin/sh
# Written by tests/hosts_wrapper.py for instance {prefix}: stands in for ssh in
#   mpiexec -launcher ssh -launcher-exec THIS -iface {bridge} -hosts ...   (MPICH)
#   mpirun --mca plm_rsh_agent THIS --host ...                             (Open MPI)
# The launcher runs it as `THIS [-x] HOST CMD...`; it runs CMD in network namespace HOST
# with new UTS, IPC and mount namespaces: hostname HOST, a private /dev/shm and /etc/hosts.
while [ $# -gt 0 ]; do
  case "$1" in
    -x|-T|-q|-n) shift ;;   # ssh flags a launcher may pass; they mean nothing here
    *) break ;;
  esac
done
host=${{1-}}
[ $# -gt 0 ] && shift
case "$host" in
{cases}
  *) echo "hosts wrapper: unknown host '$host' (hosts: {' '.join(names)})" >&2
     exit 255 ;;
esac
exec {start} {q(tools["ip"])} netns exec "$host" \\
  {q(tools["unshare"])} --uts --ipc --mount --propagation private \\
  {q(tools["sh"])} -c {q(inner)} hosts-wrapper "$host" {q(str(workdir))} "$*"
"""
