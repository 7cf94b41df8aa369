"""The Trainer: data, forward, backward, ``strategy.step()``; evaluation; the run's files.

Every rank runs the same loop; the strategy decides what is communicated. Per epoch::

    strategy.begin_epoch  ->  for each batch: data | forward | backward | strategy.step
    ->  strategy.end_epoch(mean training loss)  ->  evaluation on the test set, each
    rank a contiguous block, sums reduced  ->  metrics.jsonl  ->  checkpoint if due

Phases (``data, forward, backward, comm_intra, comm_inter, wait, optimizer``) are
timed by the tracer; the communication layer reports its own. Outputs in ``--out``:
``metrics.jsonl``, ``summary.json``, ``model.npz`` and ``trace.json`` (DESIGN.md s.3).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from typing import Any

import numpy as np
from mpi4py import MPI

import minidp
from minidp import Tensor, backend, checkpoint, layers, no_grad, strategies, threads
from minidp import functional as F
from minidp.comm import NetworkModel, Topology, allreduce, guard, set_network_model
from minidp.config import TrainConfig
from minidp.io.datasets import NORMALIZATION, load_dataset, normalize
from minidp.io.mdp import decode, read_header, write_mdp
from minidp.io.readers import LeaderReader, MPIIOReader, Reader, open_reader
from minidp.optim import LARS, SGD, CosineLR, LRScheduler, PolynomialLR, Schedule, StepLR
from minidp.optim.schedules import WarmupLR
from minidp.trace import PHASES, Tracer, chrome_trace, set_tracer


def _atomic_write(path: str, write: Any, mode: str = "w") -> None:
    tmp = f"{path}.tmp"
    with open(tmp, mode) as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Trainer:
    """One training run on every rank of ``comm`` (default the world).

    Args:
        config: the checked configuration (:class:`minidp.config.TrainConfig`).
        comm: the communicator of the job.
    """

    def __init__(self, config: TrainConfig, comm: MPI.Comm | None = None) -> None:
        self.config = config.check()
        if backend.get_backend() != "numpy":
            raise ValueError(f"backend: got {backend.get_backend()!r}, allowed: 'numpy'; the "
                             "strategies keep their buffers in host shared-memory windows")
        if config.comm_timeout is not None:
            guard.set_timeout(config.comm_timeout)
        self.topology = Topology(comm, config.ranks_per_node)
        self.rank, self.size = self.topology.rank, self.topology.size
        set_network_model(NetworkModel(config.net_latency_us, config.net_bandwidth_gbps))
        self.tracer = set_tracer(Tracer(self.rank))
        self.batch_size = config.per_worker_batch(self.size)
        self.reader, self.test_x, self.test_y = self._open_data()
        self.batches = self.reader.batches_per_epoch(self.batch_size)
        self.mean, self.std = NORMALIZATION[config.dataset]
        self.dtype = np.dtype(config.dtype)
        self.model = self._build_model()
        self.optimizer = self._build_optimizer()
        self.strategy = strategies.get(config.strategy, self.model, self.optimizer,
                                       self.topology, allreduce=config.allreduce,
                                       **config.options)
        self.strategy.plan(config.epochs)
        self.scheduler = LRScheduler(self.optimizer, self._schedule())
        self.history: list[dict[str, Any]] = []
        self.totals = {"elapsed_s": 0.0}

    # -- set-up -----------------------------------------------------------------------

    def _paths(self) -> tuple[str, str]:
        d, name = self.config.data_dir, self.config.dataset
        return os.path.join(d, f"{name}-train.mdp"), os.path.join(d, f"{name}-test.mdp")

    def _open_data(self) -> tuple[Reader, np.ndarray, np.ndarray]:
        """Prepare missing files on rank 0, check that every rank sees them, open them."""
        world, paths = self.topology.world, self._paths()
        error = None
        if self.rank == 0 and not all(os.path.exists(p) for p in paths):
            try:
                data = load_dataset(self.config.dataset, self.config.data_dir)
                os.makedirs(self.config.data_dir, exist_ok=True)
                for path, x, y in zip(paths, (data.x_train, data.x_test),
                                      (data.y_train, data.y_test)):
                    write_mdp(path, x, y, data.num_classes, progress=False)
            except (OSError, ValueError) as exc:
                error = str(exc)
        error = world.bcast(error)
        if error:
            raise FileNotFoundError(f"rank {self.rank}: dataset {self.config.dataset!r}: no "
                                    f".mdp files in '{self.config.data_dir}' and rank 0 could "
                                    f"not prepare them: {error}")
        problem = None
        try:
            for path in paths:
                read_header(path)
        except (OSError, ValueError) as exc:
            problem = str(exc)
        problems = world.allgather(problem)
        bad = [r for r, p in enumerate(problems) if p]
        if bad:
            raise FileNotFoundError(f"rank {self.rank}: dataset files unusable on rank(s) "
                                    f"{', '.join(map(str, bad))}: {problems[bad[0]]}; every rank "
                                    "must read the same --data-dir (a shared file system)")
        train, test = paths
        if self.config.reader == "leader":
            reader = LeaderReader(train, world, self.config.seed, self.config.train_samples,
                                  ranks_per_node=self.config.ranks_per_node)
        else:
            reader = open_reader(self.config.reader, train, world, self.config.seed,
                                 self.config.train_samples)
        tests = MPIIOReader(test, world, limit=self.config.test_samples)
        x, y = decode(np.concatenate(tests.read_block(0) or [np.empty(0, np.uint8)]),
                      tests.header)
        return reader, x, y

    def _build_model(self) -> layers.Module:
        shape = self.reader.header.sample_shape
        classes = self.reader.header.num_classes
        layers.manual_seed(self.config.seed)  # rank 0's draw is broadcast by the strategy
        name = self.config.model
        if name == "mlp":
            model = layers.mlp(int(np.prod(shape)), num_classes=classes)
        else:
            model = layers.MODELS[name](in_channels=shape[0], num_classes=classes)
        for _, module in model.named_modules():
            if isinstance(module, layers.Dropout):  # independent masks on every rank
                module.rng = np.random.default_rng([self.config.seed, self.rank])
        return model.to(self.dtype)

    def _build_optimizer(self) -> SGD | LARS:
        c = self.config
        if c.optimizer == "lars":
            return LARS(self.model.parameters(), lr=c.lr, momentum=c.momentum,
                        weight_decay=c.weight_decay, trust_coefficient=c.trust_coefficient)
        return SGD(self.model.parameters(), lr=c.lr, momentum=c.momentum, nesterov=c.nesterov,
                   weight_decay=c.weight_decay)

    def _schedule(self) -> Schedule:
        c, total = self.config, self.config.epochs * self.batches
        schedule = {"constant": lambda: Schedule(c.lr),
                    "cosine": lambda: CosineLR(c.lr, total),
                    "step": lambda: StepLR(c.lr, max(1, total // 3)),
                    "poly": lambda: PolynomialLR(c.lr, total)}[c.schedule]()
        if c.warmup_epochs:
            schedule = WarmupLR(schedule, c.warmup_epochs * self.batches)
        return schedule

    # -- the loop -------------------------------------------------------------------------

    def fit(self) -> dict[str, Any]:
        """Train (resuming if asked), write the outputs; returns the summary (every rank)."""
        c = self.config
        start = self._resume() if c.resume else 0
        if self.rank == 0:
            os.makedirs(c.out, exist_ok=True)
            _atomic_write(os.path.join(c.out, "metrics.jsonl"),
                          lambda f: f.writelines(json.dumps(m) + "\n" for m in self.history))
        for epoch in range(start, c.epochs):
            metrics = self.train_epoch(epoch)
            self.history.append(metrics)
            if self.rank == 0:
                with open(os.path.join(c.out, "metrics.jsonl"), "a") as f:
                    f.write(json.dumps(metrics) + "\n")
                self._print_epoch(metrics)
            done = epoch + 1
            if c.checkpoint_every and (done % c.checkpoint_every == 0 or done == c.epochs):
                self._save_checkpoint(done)
            if c.stop_after and done - start >= c.stop_after and done < c.epochs:
                break
        return self._finish()

    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """One epoch on this rank; returns the epoch's metrics (equal on every rank)."""
        tr, started = self.tracer, time.perf_counter()
        tr.reset()
        self.strategy.begin_epoch(epoch, self.batches)
        self.model.train()
        with tr.phase("data"):
            stream = self.reader.epoch(epoch, self.batch_size)
        loss_sum = 0.0
        for batch in range(self.batches):
            with tr.phase("data"):
                x, y = stream.take(self.strategy.batch_size(self.batch_size))
                x = normalize(x, self.mean, self.std).astype(self.dtype, copy=False)
            with tr.phase("forward"):
                self.optimizer.zero_grad()
                loss = F.cross_entropy(self.model(Tensor(x)), y)
            with tr.phase("backward"):
                loss.backward()
            self.strategy.step(batch)
            self.scheduler.step()
            value = loss.item()
            if not np.isfinite(value):
                raise FloatingPointError(f"rank {self.rank}: training loss is {value} at epoch "
                                         f"{epoch + 1}, batch {batch}; lower --lr")
            loss_sum += value
            self._progress(epoch, batch)
        comm = sum(tr.seconds.get(p, 0.0) for p in ("comm_intra", "comm_inter", "wait"))
        seconds = np.array([tr.seconds.get(p, 0.0) for p in PHASES] +
                           [comm, time.perf_counter() - started])
        world = self.topology.world
        guard.wait(world.Iallreduce(MPI.IN_PLACE, seconds, op=MPI.MAX), world, "epoch timers")
        train_loss = self._world_sum(np.array([loss_sum / self.batches]))[0] / self.size
        self.strategy.end_epoch(epoch, float(train_loss))
        self._average_buffers()
        for key in ("bytes_intra", "bytes_inter", "messages_intra", "messages_inter"):
            self.totals[key] = self.totals.get(key, 0) + tr.counters.get(key, 0)
        test_loss, accuracy = self.evaluate()
        wall = float(seconds[-1])
        self.totals["elapsed_s"] += wall
        return {"epoch": epoch + 1, "train_loss": float(train_loss), "test_loss": test_loss,
                "test_accuracy": accuracy, "wall_s": wall,
                "samples": self.batches * self.batch_size * self.size,
                "phases": {p: float(s) for p, s in zip(PHASES, seconds)},
                "comm_s": float(seconds[-2])}

    def _world_sum(self, values: np.ndarray) -> np.ndarray:
        return allreduce(values.astype(np.float64), self.topology, "mpi")

    def _average_buffers(self) -> None:
        """BatchNorm statistics: averaged over ranks at each epoch's end (one model)."""
        buffers = self.strategy.float_buffers()
        if buffers:
            flat = self._world_sum(np.concatenate([b.reshape(-1) for b in buffers]))
            offset = 0
            for b in buffers:
                b[...] = (flat[offset:offset + b.size] / self.size).reshape(b.shape)
                offset += b.size

    def evaluate(self) -> tuple[float, float]:
        """(mean loss, accuracy) on the test set: each rank its block, sums reduced."""
        self.model.eval()
        sums = np.zeros(3)
        with no_grad():
            for i in range(0, len(self.test_y), 1000):
                x = normalize(self.test_x[i:i + 1000], self.mean, self.std).astype(self.dtype)
                y = self.test_y[i:i + 1000]
                out = self.model(Tensor(x))
                sums[0] += F.cross_entropy(out, y, reduction="sum").item()
                sums[1] += int((out.data.argmax(axis=1) == y).sum())
                sums[2] += len(y)
        self.model.train()
        total = self._world_sum(sums)
        return float(total[0] / total[2]), float(total[1] / total[2])

    # -- output ---------------------------------------------------------------------------

    def _progress(self, epoch: int, batch: int) -> None:
        if self.rank or not self.config.progress or not sys.stderr.isatty():
            return
        done = (batch + 1) / self.batches
        sys.stderr.write(f"\repoch {epoch + 1}/{self.config.epochs} "
                         f"[{'#' * int(30 * done):<30}] {batch + 1}/{self.batches}")
        if batch + 1 == self.batches:
            sys.stderr.write("\r" + " " * 60 + "\r")
        sys.stderr.flush()

    def _print_epoch(self, m: dict[str, Any]) -> None:
        comm = m["comm_s"]
        print(f"epoch {m['epoch']}/{self.config.epochs}: train loss {m['train_loss']:.4f}  "
              f"test loss {m['test_loss']:.4f}  test accuracy {m['test_accuracy']:.2%}  "
              f"{m['wall_s']:.1f} s (communication {comm / m['wall_s']:.0%})", flush=True)

    def consensus_state(self) -> dict[str, np.ndarray]:
        """The result model's state_dict (the strategy's consensus parameters)."""
        flat = self.strategy.flat
        saved = flat.data.copy()
        flat.data[...] = self.strategy.consensus()
        state = {k: np.array(v) for k, v in self.model.state_dict().items()}
        flat.data[...] = saved
        return state

    def _finish(self) -> dict[str, Any]:
        events = self.topology.world.gather(self.tracer.events, root=0)
        counters = {k: int(v) for k, v in self.totals.items() if k != "elapsed_s"}
        per_rank = self.topology.world.gather(counters, root=0)
        state = self.consensus_state()
        summary = None
        if self.rank == 0:
            out = self.config.out
            _atomic_write(os.path.join(out, "model.npz"), lambda f: np.savez(f, **state), "wb")
            _atomic_write(os.path.join(out, "trace.json"),
                          lambda f: json.dump(chrome_trace(events), f))
            summary = self._summary(per_rank)
            _atomic_write(os.path.join(out, "summary.json"),
                          lambda f: json.dump(summary, f, indent=1))
        return self.topology.world.bcast(summary)

    def _summary(self, per_rank: list[dict[str, int]]) -> dict[str, Any]:
        totals = {k: sum(r.get(k, 0) for r in per_rank) for k in per_rank[0]}
        last = self.history[-1] if self.history else {}
        return {
            "config": dataclasses.asdict(self.config),
            "world_size": self.size, "topology": self.topology.describe(),
            "batches_per_epoch": self.batches, "batch_size_per_worker": self.batch_size,
            "versions": {"minidp": minidp.__version__, "python": platform.python_version(),
                         "numpy": np.__version__, "mpi4py": __import__("mpi4py").__version__,
                         "mpi": MPI.Get_library_version().strip().splitlines()[0]},
            "threads_per_rank": threads.threads_per_rank(),
            "final": {k: last.get(k) for k in ("epoch", "train_loss", "test_loss",
                                               "test_accuracy")},
            "bytes_sent": {"intra": totals.get("bytes_intra", 0),
                           "inter": totals.get("bytes_inter", 0)},
            "messages_sent": {"intra": totals.get("messages_intra", 0),
                              "inter": totals.get("messages_inter", 0)},
            "wall_s": self.totals["elapsed_s"],
            "epochs": self.history,
        }

    # -- checkpoints ----------------------------------------------------------------------

    def _save_checkpoint(self, epoch: int) -> None:
        flat = self.strategy.flat
        arrays = {"params": np.array(flat.data), "optimizer": np.array(self.optimizer.state)}
        arrays.update({f"buffer:{k}": np.array(b) for k, b in self.model.named_buffers()})
        dropout = [m.rng.bit_generator.state for _, m in self.model.named_modules()
                   if isinstance(m, layers.Dropout)]
        state = {"lr": self.optimizer.lr, "optimizer_step": self.optimizer.step_count,
                 "scheduler_step": self.scheduler.last_step, "dropout": dropout,
                 "strategy": self.strategy.state_dict(), "totals": self.totals}
        checkpoint.save(self.config.out, epoch, self.topology, arrays, state,
                        {"strategy": self.config.strategy, "history": self.history})

    def _resume(self) -> int:
        meta, arrays, state = checkpoint.load(self.config.out, self.topology)
        flat = self.strategy.flat
        flat.data[...] = arrays["params"]
        self.optimizer.load_state_dict({"lr": state["lr"], "step": state["optimizer_step"],
                                        "state": arrays["optimizer"]})
        for key, b in self.model.named_buffers():
            b[...] = arrays[f"buffer:{key}"]
        dropouts = [m for _, m in self.model.named_modules() if isinstance(m, layers.Dropout)]
        for module, rng_state in zip(dropouts, state["dropout"]):
            module.rng.bit_generator.state = rng_state
        self.scheduler.last_step = state["scheduler_step"]
        self.optimizer.lr = state["lr"]
        self.strategy.load_state_dict(state["strategy"])
        self.totals = dict(state["totals"])
        self.history = list(meta["history"])
        return int(meta["epoch"])


def train(config: TrainConfig) -> dict[str, Any]:
    """Run ``config`` on every rank of the world; returns the summary."""
    return Trainer(config).fit()
