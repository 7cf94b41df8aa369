"""Every blocking MPI call goes through minidp.comm.guard (docs/design.md, "Rules").

The package's source is parsed with ``ast``; a call written ``X.Name(...)``, where
``Name`` is an MPI operation that can wait for another rank, is an error outside
``minidp/comm/guard.py``, whose wrappers time the wait and name the rank that never
came. Other modules start non-blocking operations (``Iallreduce``, ``Isend``,
``Iread_at_all``) and complete them through ``guard.wait`` / ``p2p_wait.wait_peer``, and
pass what has no non-blocking form uncalled to ``guard.collective`` (``Split``,
``Fence``, ``Free``, ...).

Not flagged, as they are not MPI: calls on a minidp module (``p2p.send``, itself
guarded), and ``self.name(...)`` where this module defines ``name`` (a minidp method
such as DASO's ``send``). The lowercase ``wait``/``test`` are left out: they are the
names of minidp's own request objects, and minidp never starts mpi4py's pickled
non-blocking requests that those names would complete.
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "minidp")
GUARD = "minidp/comm/guard.py"

BLOCKING = {
    # Comm: collectives (buffer and pickled forms)
    "Barrier", "Bcast", "bcast", "Gather", "Gatherv", "gather", "Scatter", "Scatterv",
    "scatter", "Allgather", "Allgatherv", "allgather", "Alltoall", "Alltoallv", "Alltoallw",
    "alltoall", "Reduce", "reduce", "Allreduce", "allreduce", "Reduce_scatter",
    "Reduce_scatter_block", "Scan", "Exscan", "scan", "exscan",
    # Comm: point-to-point
    "Send", "Ssend", "Bsend", "Rsend", "send", "ssend", "bsend", "Recv", "recv",
    "Sendrecv", "Sendrecv_replace", "sendrecv", "Probe", "probe", "Mprobe", "mprobe",
    # Request completion
    "Wait", "Waitall", "Waitany", "Waitsome",
    # communicator, window and file creation and release (collective)
    "Dup", "Dup_with_info", "Split", "Split_type", "Create", "Create_group", "Create_cart",
    "Create_graph", "Create_dist_graph", "Create_intercomm", "Merge", "Accept", "Connect",
    "Spawn", "Free", "Allocate", "Allocate_shared", "Create_dynamic",
    # one-sided synchronisation that waits for other ranks
    "Fence", "Start", "Complete", "Lock", "Lock_all",
    # MPI-IO collectives
    "Open", "Close", "Read_all", "Read_at_all", "Write_all", "Write_at_all",
    "Read_ordered", "Write_ordered", "Set_view", "Set_size", "Preallocate", "Set_atomicity",
    "Sync",
}

# (file, enclosing function, method): local calls that share a blocking call's name.
ALLOWED = {
    ("minidp/comm/board.py", "members", "Free"):
        "Group.Free is local (MPI_Group_free involves no other rank)",
    ("minidp/comm/shared.py", "__init__", "Lock_all"):
        "a shared lock on every rank of a passive-target window: waits for no rank",
    ("minidp/comm/shared.py", "sync", "Sync"):
        "Win.Sync is a memory barrier of this rank (File.Sync is the collective one)",
    ("minidp/io/readers/strided.py", "read_records", "Open"):
        "the strided baseline opens the file on COMM_SELF: no other rank takes part",
    ("minidp/io/readers/strided.py", "read_records", "Close"):
        "closes that COMM_SELF file: no other rank takes part",
    ("minidp/io/readers/base.py", "open_for_blocks", "Create"):
        "Info.Create makes a hints object in this rank's MPI: a local call",
    ("minidp/io/readers/base.py", "open_for_blocks", "Free"):
        "Info.Free releases it: a local call",
    ("minidp/comm/wire.py", "__init__", "Create"):
        "Op.Create registers a reduction function with this rank's MPI: a local call",
    ("minidp/comm/wire.py", "free", "Free"):
        "Op.Free releases that function: a local call",
}


def _minidp_modules(tree: ast.Module) -> set[str]:
    """Names this module binds to minidp modules (``from minidp.comm import p2p``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minidp"):
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                if os.path.exists(os.path.join(ROOT, *target.split("."))) or \
                        os.path.exists(os.path.join(ROOT, *target.split(".")) + ".py"):
                    names.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            names.update(a.asname or a.name.split(".")[0] for a in node.names
                         if a.name.startswith("minidp"))
    return names


def _other_modules(tree: ast.Module) -> set[str]:
    """Names this module binds to modules that are not MPI's (``import threading``): their
    ``Lock`` or ``Free`` is not a blocking MPI call."""
    return {alias.asname or alias.name.split(".")[0] for node in ast.walk(tree)
            if isinstance(node, ast.Import) for alias in node.names
            if not alias.name.startswith(("mpi4py", "minidp"))}


def blocking_calls(path: str) -> list[tuple[int, str, str, str]]:
    """(line, enclosing function, method, call text) of every blocking call in ``path``."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    modules = _minidp_modules(tree) | _other_modules(tree)
    own_methods = {n.name for n in ast.walk(tree)
                   if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    found = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in BLOCKING:
            receiver = node.func.value
            name = receiver.id if isinstance(receiver, ast.Name) else None
            if name not in modules and not (name == "self" and node.func.attr in own_methods):
                found.append((node.lineno, function, node.func.attr, ast.unparse(node.func)))
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def package_files() -> list[str]:
    """Every .py file of the package, relative to the repository root."""
    files = []
    for folder, _, names in os.walk(PACKAGE):
        files += [os.path.relpath(os.path.join(folder, n), ROOT) for n in names
                  if n.endswith(".py")]
    return sorted(files)


def test_every_blocking_mpi_call_goes_through_the_guard():
    offenders, matched = [], set()
    for rel in package_files():
        if rel == GUARD:
            continue
        for line, function, method, text in blocking_calls(os.path.join(ROOT, rel)):
            key = (rel, function, method)
            if key in ALLOWED:
                matched.add(key)
                continue
            offenders.append(f"{rel}:{line}: {text}(...) in {function}() blocks outside "
                             "minidp.comm.guard; use guard.wait on its non-blocking form, "
                             "guard.collective, guard.bcast_object/allgather_object or "
                             "p2p_wait.wait_peer (minidp.comm.p2p_wait)")
    assert not offenders, "\n".join(offenders)
    stale = sorted(set(ALLOWED) - matched)
    assert not stale, f"entries that match no call any more (remove them): {stale}"


def test_the_scan_finds_calls_and_spares_minidp_and_local_names(tmp_path):
    source = tmp_path / "sample.py"
    source.write_text(
        "from minidp.comm import p2p\n"
        "import threading\n"
        "from mpi4py import MPI\n"
        "class S:\n"
        "    def send(self):\n"
        "        p2p.send(1)\n"
        "    def step(self, comm, window):\n"
        "        self.send()\n"
        "        comm.allgather(1)\n"
        "        window.Fence()\n"
        "        guard.collective(comm, 'split', comm.Split, 0)\n"
        "        threading.Lock()\n"
        "        MPI.File.Open(comm, 'f')\n")
    assert [(line, fn, m) for line, fn, m, _ in blocking_calls(str(source))] == [
        (9, "step", "allgather"), (10, "step", "Fence"), (13, "step", "Open")]
