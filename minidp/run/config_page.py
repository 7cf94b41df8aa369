"""docs/configuration.md, written from the command line's own parser, so it cannot drift.

    python -m minidp.run.config_page > docs/configuration.md

The page lists every flag of ``minidp train`` (:func:`minidp.run.flags.build_parser`)
with its TOML key, value and default (:class:`~minidp.run.config.TrainConfig`), the
strategies' default learning rates (:data:`~minidp.run.config.STRATEGY_RATES`), every
strategy option with its ``--set`` and TOML forms (each strategy's declared
``options``), and the environment variables minidp reads (:data:`ENVIRONMENT`).
``tests/unit/test_config_page.py`` fails when the page and this output differ, and when
the package reads a ``MINIDP_*`` variable that :data:`ENVIRONMENT` does not describe.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys

from minidp.run.config import BATCH_SIZE, FIELDS, STRATEGY_RATES
from minidp.run.flags import build_parser
from minidp.strategies import STRATEGIES

# Every environment variable minidp reads, with what it does (grouped by purpose).
ENVIRONMENT = {
    "MINIDP_NUM_THREADS": "threads per rank (BLAS and Numba); before `OMP_NUM_THREADS`, "
    "`SLURM_CPUS_PER_TASK` and cores / ranks on the node (`python -m minidp info` says "
    "which one chose)",
    "OMP_NUM_THREADS": "threads per rank when `MINIDP_NUM_THREADS` is not set",
    "SLURM_CPUS_PER_TASK": "threads per rank when neither of the two above is set",
    "MPI_LOCALNRANKS, OMPI_COMM_WORLD_LOCAL_SIZE, MV2_COMM_WORLD_LOCAL_SIZE, "
    "SLURM_NTASKS_PER_NODE": "ranks on this node, as the launcher says (the default threads "
    "per rank divide the cores by it)",
    "OPENBLAS_NUM_THREADS, MKL_NUM_THREADS, NUMBA_NUM_THREADS": "set by minidp to the "
    "threads per rank unless you set them (not `NUMBA_NUM_THREADS` in a program that "
    "imported Numba before minidp: Numba has read it, and its next compile would fail on "
    "a changed value); the ones it filled in are listed in `MINIDP_THREAD_DEFAULTS`",
    "OPENBLAS_THREAD_TIMEOUT, OMP_WAIT_POLICY, GOMP_SPINCOUNT": "unless you set them, "
    "minidp sets them to 14, PASSIVE and 10000 while OpenBLAS and Numba's OpenMP load (not "
    "for child processes): OpenBLAS's idle worker sleeps after 7 us instead of 0.1 s, and "
    "GNU OpenMP's threads after 10000 rounds of spinning (0.1-0.3 ms), so that a step's "
    "next parallel kernel finds them awake; no spinning where this node's ranks times "
    "their threads exceed its cores, nor with your own OMP_WAIT_POLICY (a program that "
    "imports NumPy or PyTorch before minidp keeps their defaults; PyTorch imported after "
    "minidp shares its OpenMP and the setting)",
    "OPENBLAS_CORETYPE": "read, never set: `python -m minidp info` (`\"blas\"`) names the "
    "kernels OpenBLAS runs and says when this variable pins them to a type without the "
    "AVX-512 that the CPU has (half the GEMM rate on one such CPU, docs/benchmarks.md); "
    "your setting is kept, since it decides the BLAS's bits",
    "MINIDP_THREAD_DEFAULTS": "written by minidp, not by you: the thread variables it filled "
    "in, so that a child process can tell them from yours",
    "MINIDP_BACKEND": "`numpy` (default) or `cupy`: the array backend (`cupy` trains on the "
    "GPU, docs/gpu.md; without CuPy or a GPU it is refused in one line, and a program that "
    "uses minidp anyway gets that reason, never NumPy in its place)",
    "MINIDP_CUDA_KERNELS": "`0`: CuPy runs the NumPy reference code instead of minidp's CUDA "
    "kernels; `1` (default): the kernels",
    "MINIDP_HOST_REPLICA": "`1`: compute on a NumPy replica through the GPU path's staging "
    "(tests the GPU path without a GPU); `0` (default): on the model",
    "MINIDP_MALLOC_TUNING": "`0`: leave glibc's malloc thresholds as they are; `1` (default): "
    "minidp raises them at import unless `MALLOC_MMAP_THRESHOLD_` or `MALLOC_TRIM_THRESHOLD_` "
    "is set",
    "MINIDP_COMM_TIMEOUT": "seconds a rank waits in a collective before naming the ranks that "
    "never arrived (default 300; `--comm-timeout` wins)",
    "MINIDP_DEBUG": "`1`: before every collective, check that all ranks call the same "
    "operation with the same shapes and dtypes",
    "MINIDP_EXPLAIN": "N: as `--explain N`, print every communication of each rank's first N "
    "steps",
    "MINIDP_PROGRESS": "`auto` (default): a bar when the first worker's stderr is a terminal, "
    "lines when `mpiexec`'s stderr is one, nothing when output goes to files or pipes (CI, "
    "batch jobs); `bar`, `lines` or `off` choose; `--no-progress` wins",
    "MINIDP_PROGRESS_SECONDS": "seconds between two progress lines (default 2)",
    "MINIDP_MPIEXEC_ARGS": "`simulate --validate --real-nodes`: extra `mpiexec` arguments that "
    "place the job on real nodes (default of `--mpiexec-args`; `tests/hosts_cli.py shell` "
    "sets it for two hosts on one machine)",
    "XDG_CACHE_HOME": "Numba's compiled kernels go to `$XDG_CACHE_HOME/minidp/numba` (default "
    "`~/.cache/minidp/numba`) unless `NUMBA_CACHE_DIR` is set",
    "SLURM_JOB_ID": "recorded in the run's `run.json`",
}

# Flags whose TOML form is not "name = value" of their destination.
TOML_FORMS = {"--config": "(the file itself)", "--set": "`[STRATEGY]` table: `OPTION = VALUE`",
              "--nesterov": "`nesterov = true`", "--overwrite": "`overwrite = true`",
              "--no-progress": "`progress = false`", "--no-verify": "`verify = false`",
              "--resume": '`resume = "yes"` or `"auto"`'}
EXAMPLE = '''```toml
# run.toml: python -m minidp train --config run.toml [flags that override it]
strategy = "daso"
model = "lenet5"
epochs = 10
ranks_per_node = 2          # or ranks-per-node
net_latency_us = 50.0
nesterov = true

[daso]                      # options of the strategy above, as --set daso.NAME=VALUE
warmup_epochs = 1
cooldown_epochs = 1
```'''


def _value(field: dataclasses.Field) -> str:
    kind = str(field.type).removesuffix(" | None")
    return {"int": "int", "float": "number", "str": "string", "bool": "bool"}.get(kind, kind)


def _default(name: str) -> str:
    if name == "batch_size":
        return f"{BATCH_SIZE} per worker"
    if name in ("lr", "momentum"):
        return "the strategy's (below)"
    default = FIELDS[name].default
    return "unset" if default is None else f"`{default}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def flag_rows(parser: argparse.ArgumentParser) -> list[str]:
    """One table row per flag of ``parser``: flag, TOML key, value, default, help."""
    rows = ["| flag | TOML key | value | default | what |", "|---|---|---|---|---|"]
    for action in parser._actions:  # argparse's own list: every flag, in order
        if not action.option_strings or action.dest == "help":
            continue
        flag = action.option_strings[0]
        usage = flag if action.nargs == 0 else f"{flag} {action.metavar or action.dest.upper()}"
        if action.dest in FIELDS and flag not in TOML_FORMS:
            field = FIELDS[action.dest]
            toml, value, default = f"`{action.dest}`", _value(field), _default(action.dest)
        elif action.nargs == 0:  # a switch: absent unless given
            toml, value, default = TOML_FORMS[flag], "", "off"
        else:
            toml, value = TOML_FORMS[flag], "string"
            default = _default(action.dest) if action.dest in FIELDS else ""
        # the parser appends "(default X)" to the help; the default has its own column
        help_text = re.sub(r" ?\(default [^:()]*\)$", "", action.help or "")
        rows.append(f"| `{usage}` | {toml} | {value} | {default} | {_cell(help_text)} |")
    return rows


def rate_rows() -> list[str]:
    """The default (lr, momentum) of every strategy."""
    rows = ["| strategy | lr | momentum |", "|---|---|---|"]
    rows += [f"| `{name}` | {lr:g} | {momentum:g} |"
             for name, (lr, momentum) in STRATEGY_RATES.items()]
    return rows


def option_rows() -> list[str]:
    """Every strategy option: default, allowed values, what, and how to set it."""
    rows = ["| strategy | option | default | allowed | what | `--set` |",
            "|---|---|---|---|---|---|"]
    for name, cls in STRATEGIES.items():
        for option, spec in cls.options.items():
            rows.append(f"| `{name}` | `{option}` | `{spec.default}` | {_cell(spec.allowed)} | "
                        f"{_cell(spec.help)} | `--set {name}.{option}={spec.default}` |")
    return rows


def page() -> str:
    """The whole page, as docs/configuration.md holds it."""
    parser = build_parser(argparse.ArgumentParser(prog="python -m minidp train"))
    lines = [
        "# Configuration: every setting of `minidp train`", "",
        "Generated by `python -m minidp.run.config_page > docs/configuration.md` from the "
        "command line's own parser (`minidp/run/flags.py`), `TrainConfig` "
        "(`minidp/run/config.py`) and every strategy's declared options; "
        "`tests/unit/test_config_page.py` fails when this page and the code differ. Do not "
        "edit it by hand.", "",
        "## Where a setting comes from", "",
        "Defaults < `--config FILE` (TOML) < flags given on the command line. A strategy's "
        "options: their defaults < the file's table named after the strategy < `--set "
        "STRATEGY.OPTION=VALUE`. Every value, from any source, goes through the same checks "
        "before any rank communicates: an int where an int is due (not `2.0`, not `true`), "
        "a bool for a bool (`true`, not `\"true\"`), finite numbers in range; a bad value "
        "is one line `error: ...` naming the flag (or the file and key), the value and what "
        "is allowed, with exit status 2.", "",
        "A TOML file holds the flags' names without `--` (with `_` or `-`) at the top, and "
        "at most one table, named after the run's strategy, of that strategy's options. An "
        "unknown key is refused with the list of valid ones; a table of another strategy "
        "than the run's is refused. `summary.json` and `run.json` record the whole "
        "configuration, defaults filled in.", "", EXAMPLE, "",
        "## Flags", "", *flag_rows(parser), "",
        "## Learning rate and momentum: the strategy's defaults", "",
        f"Without `--lr` or `--momentum` a run takes its strategy's (batch {BATCH_SIZE} per "
        "worker): with these, every strategy's training loss falls every epoch for 3 epochs "
        "and its test accuracy rises over them on mnist-5k (LeNet-5, 4 ranks as 2 nodes x 2; "
        "`tests/test_defaults.py`) and `make "
        "demo` (`hsgd`, 5 epochs) reaches 85% on it. Momentum is 0 where the strategy "
        "applies plain SGD (`asgd`, `dbs`, `hogwild`, `softsync` and the elastic family: their "
        "`--momentum` would be unused; `measgd-async` has its own `delta`); `amsgd` keeps "
        "0.7, since stale gradients add momentum of their own; the elastic workers, pulled "
        "back towards the centre at every exchange, take larger steps. A given `--lr` or "
        "`--momentum` wins. On Fashion-MNIST (468 batches an epoch at 4 ranks, not mnist-5k's 31) "
        "the demo's 0.02 at 128 samples a step is, by the linear scaling of rate with batch, "
        "0.04 at 256, next to the 0.05 at 256 measured in docs/benchmarks.md (85.4% after "
        "the first epoch, 89.2% after the fifth, sync).", "", *rate_rows(), "",
        "## Strategy options", "",
        "Set with `--set STRATEGY.OPTION=VALUE` (repeatable; only options of the run's "
        "strategy) or in the TOML file's `[STRATEGY]` table; the pages `docs/NAME.md` "
        "explain them.", "", *option_rows(), "",
        "## Environment variables", "",
        "Every command checks minidp's variables when it starts (`minidp/run/environment.py`;"
        " `info` shows a bad one instead): a value a variable does not allow is one line "
        "naming the variable, the value and what is allowed, exit status 2, printed once by "
        "a job's rank 0. A switch takes `0` or `1` only (empty or unset: its default).", "",
        "| variable | what |", "|---|---|",
        *(f"| `{'`, `'.join(name.split(', '))}` | {_cell(text)} |"
          for name, text in ENVIRONMENT.items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(page())
