"""One mpiexec job of tests/test_hosts.py: several training runs in turn, then SPMD files.

    mpiexec ... python -m mpi4py tests/scripts/hosts_job.py PLAN.json

``PLAN.json`` holds ``data_dir``, ``ranks_per_node`` (null: MPI's nodes, on real hosts),
``runs`` (each a dict of TrainConfig settings with its own ``out``, over the small
float64 settings below), ``links`` (bracket each run with the hosts' link counters),
``info`` (a directory for each rank's ``minidp info`` report) and ``pytest`` (SPMD files
to run afterwards on the same ranks). Each run's files (model.npz, summary.json,
run.json, checkpoints) land in its ``out``; with ``links``, rank 0 reads every host's
counters from tests/hosts.py's service right before and after ``fit`` (the ranks meet in
a barrier on either side) and writes ``links.json`` there. A run that raises ValueError
on every rank (a refused setting) writes its message to ``error-RANK.txt`` there instead.
"""

import contextlib
import io
import json
import os
import sys

from mpi4py import MPI

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hosts import request_link_bytes  # noqa: E402

from minidp.kernels import ensure_compiled  # noqa: E402
from minidp.run.config import TrainConfig  # noqa: E402
from minidp.run.trainer import Trainer  # noqa: E402

SMALL = dict(dataset="synthetic", model="mlp", dtype="float64", epochs=2, batch_size=16,
             train_samples=320, test_samples=32, progress=False, comm_timeout=60)


def links() -> dict:
    """Every host's link counters, read by rank 0 once all ranks are here."""
    MPI.COMM_WORLD.Barrier()
    return request_link_bytes()["links"] if MPI.COMM_WORLD.rank == 0 else {}


def train(run: dict, plan: dict) -> None:
    """Fit one run; with ``plan["links"]``, record the link bytes around it."""
    settings = {**SMALL, "data_dir": plan["data_dir"], "ranks_per_node": plan["ranks_per_node"],
                **run}
    try:
        trainer = Trainer(TrainConfig(**settings))
    except ValueError as exc:
        os.makedirs(run["out"], exist_ok=True)
        with open(os.path.join(run["out"], f"error-{MPI.COMM_WORLD.rank}.txt"), "w") as f:
            f.write(str(exc))
        return
    before = links() if plan.get("links") else None
    trainer.fit()
    if before is not None:
        after = links()
        if MPI.COMM_WORLD.rank == 0:
            sent = {h: after[h]["tx"] - before[h]["tx"] for h in after}
            with open(os.path.join(run["out"], "links.json"), "w") as f:
                json.dump({"sent": sent}, f)


def main() -> int:
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    ensure_compiled()
    if plan.get("info"):
        from minidp.__main__ import info

        report = io.StringIO()
        with contextlib.redirect_stdout(report):
            info(None)
        with open(os.path.join(plan["info"], f"info-{MPI.COMM_WORLD.rank}.json"), "w") as f:
            f.write(report.getvalue())
    for run in plan["runs"]:
        train(run, plan)
    if plan.get("pytest"):
        import pytest

        status = pytest.main(["-x", "-q", "-p", "no:cacheprovider", *plan["pytest"]])
        return int(MPI.COMM_WORLD.allreduce(int(status), op=MPI.MAX))
    return 0


if __name__ == "__main__":
    sys.exit(main())
