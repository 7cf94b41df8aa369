"""The package's layout: the modules at minidp's root, import circles, and layers.

The source is parsed with ``ast`` (as the guard scan does), so the check sees imports
inside functions too, where a circle hides until the function runs. A module's imports
are the minidp modules its ``import`` statements name: ``from minidp.comm import guard``
names ``minidp.comm.guard`` (a module), ``from minidp.comm import Topology`` names the
package ``minidp.comm``.
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "minidp")

# The package's face (with the old import paths, _moved) and what every layer uses;
# everything else lives in a package.
ROOT_MODULES = {"__init__", "__main__", "_moved", "backend", "threads", "trace", "allocator",
                "functional"}
# The one inherent circle: ops build Tensors, and Tensor's operators call ops.
CIRCLE_ALLOWED = "minidp.autograd"
# Lower layers never import higher ones (a layer may import its own and lower ones).
LAYERS = [("minidp", "minidp._moved", "minidp.backend", "minidp.threads", "minidp.trace",
           "minidp.allocator"),
          ("minidp.kernels", "minidp.autograd", "minidp.functional"),
          ("minidp.layers", "minidp.optim"), ("minidp.comm",), ("minidp.io",),
          ("minidp.strategies",), ("minidp.run",),
          ("minidp.reporting", "minidp.simulate", "minidp.replay"),
          ("minidp.__main__",)]


def modules() -> dict[str, str]:
    """{dotted module name: path} of every module of the package."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), ROOT)[:-3].split(os.sep)
                dotted = ".".join(rel[:-1] if rel[-1] == "__init__" else rel)
                found[dotted] = os.path.join(folder, name)
    return found


def imports(path: str, known: dict[str, str]) -> set[str]:
    """The minidp modules that the file at ``path`` imports, anywhere in it."""
    names = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == "minidp")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                and node.module.split(".")[0] == "minidp":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                names.add(sub if sub in known else node.module)
    return {n for n in names if n in known}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, known) - {name} for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of the longest prefix that names ``module``'s layer."""
    best = max((p for group in LAYERS for p in group
                if module == p or module.startswith(p + ".")), key=len)
    return next(i for i, group in enumerate(LAYERS) if best in group)


def test_the_root_holds_only_the_package_face_and_what_every_layer_uses():
    at_root = {name[:-3] for name in os.listdir(PACKAGE) if name.endswith(".py")}
    assert at_root - ROOT_MODULES == set(), (
        f"modules at minidp/'s root beyond {sorted(ROOT_MODULES)}: move them into the "
        "package of their job (docs/design.md)")
    assert len(at_root) <= 8


def test_no_import_circle_outside_the_autograd_core():
    bad = [c for c in circles(graph())
           if not all(m == CIRCLE_ALLOWED or m.startswith(CIRCLE_ALLOWED + ".") for m in c)]
    assert bad == [], f"import circles: {bad}"


def test_lower_layers_never_import_higher_ones():
    upward = sorted(f"{m} imports {n}" for m, targets in graph().items() for n in targets
                    if layer(n) > layer(m) and m != "minidp")
    assert upward == [], "\n".join(upward)


def test_the_checks_see_a_circle_and_an_upward_import():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c"]]
    assert layer("minidp.strategies.sync") > layer("minidp.comm.guard")
    assert layer("minidp.run.trainer") > layer("minidp.strategies")


def uses_of(name: str, path: str) -> list[int]:
    """The lines of the file at ``path`` that import, name or reach ``name`` (``x.name``)."""
    lines = []
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names) or \
                isinstance(node, ast.Name) and node.id == name or \
                isinstance(node, ast.Attribute) and node.attr == name:
            lines.append(node.lineno)
    return sorted(lines)


# Where the SGD kernel may be called: the optimizers own the update (and the rate), the
# kernels define it. The replay has its own SGD, written apart from both (rules.py).
UPDATE_KERNEL_USERS = ("minidp.optim", "minidp.kernels")


def test_only_the_optimizers_call_the_update_kernel():
    found = {m: uses_of("sgd_update", path) for m, path in modules().items()}
    outside = sorted(f"{m} (lines {found[m]})" for m in found
                     if found[m] and not m.startswith(UPDATE_KERNEL_USERS))
    assert outside == [], ("sgd_update outside minidp/optim and minidp/kernels: step "
                           f"through the optimizer (SGD.step) instead: {outside}")
    assert found["minidp.optim.sgd"] and found["minidp.optim.lars"]


def test_the_update_kernel_scan_sees_every_form(tmp_path):
    source = tmp_path / "user.py"
    source.write_text("from minidp.kernels import sgd_update\nimport minidp.kernels as k\n"
                      "k.sgd_update(1)\nf = sgd_update\n")
    assert uses_of("sgd_update", str(source)) == [1, 3, 4]


def test_each_strategy_id_lives_in_the_file_of_its_name():
    from minidp.strategies import STRATEGIES

    misplaced = {name: cls.__module__ for name, cls in STRATEGIES.items()
                 if cls.__module__ != "minidp.strategies." + name.replace("-", "_")}
    assert misplaced == {}


# -- facts on the class, and the loop that shows the loop ----------------------------------

# Where a strategy's id may be written as a string: its own package, and the replay, which
# re-executes a run from the papers' rules and never imports strategies/ (docs/replay.md).
IDS_ALLOWED_IN = ("minidp.strategies", "minidp.replay")


def string_ids(path: str, ids: set[str]) -> list[tuple[int, str]]:
    """(line, id) of every string constant in the file at ``path`` that is a strategy id."""
    return sorted((node.lineno, node.value) for node in ast.walk(ast.parse(open(path).read()))
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and node.value in ids)


def test_no_strategy_id_is_written_as_a_string_outside_strategies_and_replay():
    """A strategy's facts are on its class, never keyed by its name elsewhere.

    Default rates (``Strategy.default_rates``), resume rules (``any_world_size``,
    ``fixed_epochs``), what a checkpoint keeps (``state_dict``), how the simulator costs
    it (``simulate.predict.COSTS``, keyed by class): a comparison with ``"daso"`` or a
    table keyed by ``"sync"`` outside the strategy's own file is a fact in the wrong place.
    """
    from minidp.strategies import names

    ids = set(names())
    found = {m: string_ids(path, ids) for m, path in modules().items()
             if not m.startswith(IDS_ALLOWED_IN)}
    outside = sorted(f"{m}:{line} {value!r}" for m, hits in found.items()
                     for line, value in hits)
    assert outside == [], ("strategy ids as strings outside minidp/strategies and "
                           f"minidp/replay: make them facts on the class: {outside}")


def test_the_id_scan_sees_comparisons_tables_and_arguments(tmp_path):
    source = tmp_path / "user.py"
    source.write_text('if name == "daso":\n    pass\nRATES = {"sync": 1}\n'
                      'ok = name in ("hsgd", "x")\nmake("easgd-rr")\ntext = "a daso run"\n')
    assert string_ids(str(source), {"daso", "sync", "hsgd", "easgd-rr"}) == [
        (1, "daso"), (3, "sync"), (4, "hsgd"), (5, "easgd-rr")]


def calls_in_order(node: ast.AST) -> list[str]:
    """The calls under ``node`` in source order, each as its unparsed callee (``x.y``)."""
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call)]
    return [ast.unparse(c.func) for c in sorted(calls, key=lambda c: (c.lineno,
                                                                      c.col_offset))]


def batch_loop() -> list[str]:
    """The calls of the Trainer's batch loop (the ``while`` of ``Trainer._work``)."""
    tree = ast.parse(open(os.path.join(PACKAGE, "run", "trainer.py")).read())
    work = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
                and n.name == "_work")
    loop = next(n for n in ast.walk(work) if isinstance(n, ast.While))
    return calls_in_order(loop)


def test_the_trainer_batch_loop_zeroes_forwards_backwards_and_steps_in_that_order():
    calls = batch_loop()

    def first(name: str) -> int:
        found = [i for i, call in enumerate(calls) if call == name or
                 call.endswith("." + name)]
        assert found, f"no call of {name} in Trainer._work's batch loop: {calls}"
        return found[0]

    order = [first("zero_grad"), first("model"), first("backward"), first("strategy.step")]
    assert order == sorted(order), f"zero_grad, forward, backward, step: {calls}"


def test_the_gpu_path_only_moves_data():
    replica = os.path.join(PACKAGE, "run", "replica.py")
    assert uses_of("zero_grad", replica) == [], "the gradients are zeroed in the loop"
    assert uses_of("backward", replica) == [] and uses_of("step", replica) == []
