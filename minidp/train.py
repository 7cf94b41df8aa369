"""The Trainer: data, forward, backward, ``strategy.step()``; evaluation; the run's files.

The loop is driven by data, not by a count. Per epoch, on every rank::

    strategy.begin_epoch
    worker: while n := strategy.batch_size(b): data(n) | forward | backward | strategy.step
    server: strategy.serve()             (until every worker's epoch is over)
    every rank: epoch timers and loss reduced -> strategy.end_epoch -> BatchNorm
    statistics averaged over the workers -> evaluation of strategy.consensus() on the
    test set (each rank a contiguous block, sums reduced) -> metrics.jsonl -> checkpoint

On a GPU (``MINIDP_BACKEND=cupy``) forward and backward run on a replica of the model on
the device (:mod:`minidp.replica`): the parameters go up before each batch, the gradients
come down after backward, and everything else (strategy, optimizer, checkpoints) works
on the host model as on the CPU; the copies are timed in ``data`` and ``backward``.

Phases (``data, forward, backward, comm_intra, comm_inter, wait, optimizer``) are
timed by the tracer; the communication layer reports its own. ``--slowdown RANK:F``
makes a rank's compute F times slower (it sleeps (F-1) x its measured forward and
backward time, inside ``backward``), so stragglers can be shown on one machine.
Outputs (:mod:`minidp.report`): ``metrics.jsonl``, ``model.npz`` (the evaluated
model), ``summary.json``, then ``trace.json`` (DESIGN.md s.3).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from minidp import (
    Tensor,
    backend,
    faults,
    layers,
    no_grad,
    rundir,
    strategies,
    threads,
    train_state,
)
from minidp import functional as F
from minidp.comm import (
    Communicator,
    NetworkModel,
    Topology,
    allreduce,
    broadcast_object,
    guard,
    mpi_library,
    set_network_model,
    versions,
    world_max,
)
from minidp.config import TrainConfig
from minidp.console import Explainer, Progress, explain_steps
from minidp.io.datasets import NORMALIZATION, normalize
from minidp.io.readers import epoch_rng
from minidp.io.training_data import open_training_data
from minidp.optim import LRScheduler
from minidp.replica import replica_for
from minidp.report import RunFiles
from minidp.stopping import Stopped, StopSignal
from minidp.trace import PHASES, Tracer, set_tracer

COUNTERS = ("bytes_intra", "bytes_inter", "messages_intra", "messages_inter")


class Trainer:
    """One training run on every rank of ``comm`` (default the world).

    Args:
        config: the checked configuration (:class:`minidp.config.TrainConfig`).
        comm: the communicator of the job.
    """

    def __init__(self, config: TrainConfig, comm: Communicator | None = None) -> None:
        self.config = c = config.check()
        if c.comm_timeout is not None:
            guard.set_timeout(c.comm_timeout)
        servers = strategies.strategy_class(c.strategy).servers_needed(c.options)
        self.topology = t = Topology(comm, c.ranks_per_node, servers)
        self.rank, self.size, self.is_worker = t.rank, t.size, t.role == "worker"
        self.device = backend.select_device(t.host_rank)
        set_network_model(NetworkModel(c.net_latency_us, c.net_bandwidth_gbps))
        self.tracer = set_tracer(Tracer(self.rank))
        explained = explain_steps(c.explain)
        if explained:  # before the strategy exists: its first broadcast is step 0
            self.tracer.listener = Explainer(t, explained)
        self.batch_size = c.per_worker_batch(t.num_workers)
        self.data = open_training_data(c.dataset, c.data_dir, c.reader, c.seed, c.train_samples,
                                       c.test_samples, t, verify=c.verify)
        if self.batch_size > self.data.samples_per_worker:
            raise ValueError(f"rank {self.rank}: batch size {self.batch_size} for "
                             f"{c.dataset!r}: allowed 1 to {self.data.samples_per_worker} "
                             f"(samples per worker per epoch over {t.num_workers} workers)")
        self.batches = self.data.samples_per_worker // self.batch_size
        self.mean, self.std = NORMALIZATION[c.dataset]
        self.dtype = np.dtype(c.dtype)
        self.model = self._build_model()
        self.optimizer = c.build_optimizer(self.model.parameters())
        if explained and self.rank == 0:
            Explainer.introduce(strategies.strategy_class(c.strategy))
        self.strategy = strategies.get(c.strategy, self.model, self.optimizer, t,
                                       allreduce=c.allreduce, **c.options)
        schedule = c.lr_schedule(self.batches)
        self.strategy.plan(c.epochs, self.batch_size, schedule)
        self.scheduler = LRScheduler(self.optimizer, schedule)
        self.compute = replica_for(self.model)  # the model on this rank's GPU, if any
        self.slowdown = c.slowdowns().get(self.rank, 1.0)
        self.progress = Progress(self.rank, t.worker_ranks[0], c.progress, c.epochs,
                                 self.batches)
        self.injector = faults.Injector(faults.parse(c.inject_fault), self.rank, self.size,
                                        tuple(t.server_ranks))
        self.history: list[dict[str, Any]] = []
        self.totals = {"elapsed_s": 0.0, "steps": 0}  # steps: this rank's, over the run
        self.partial: dict[str, Any] | None = None  # an epoch resumed between batches

    # -- set-up -----------------------------------------------------------------------

    def _build_model(self) -> layers.Module:
        shape, classes = self.data.header.sample_shape, self.data.header.num_classes
        layers.manual_seed(self.config.seed)  # rank 0's draw is broadcast by the strategy
        model = layers.model_for(self.config.model, shape, classes)
        for _, module in model.named_modules():
            if isinstance(module, layers.Dropout):  # independent masks on every rank
                module.rng = np.random.default_rng([self.config.seed, self.rank])
        return model.to("cpu").to(self.dtype)  # the host model: strategies own it

    # -- the loop -------------------------------------------------------------------------

    def fit(self) -> dict[str, Any]:
        """Train (resuming if asked), write the outputs; returns the summary (every rank).

        Raises:
            Stopped: on every rank, after a SIGTERM or SIGUSR1 (:mod:`minidp.stopping`)
                made the ranks stop and write a checkpoint.
        """
        c, world = self.config, self.topology.world
        c.out, resuming = rundir.open_run(c.out, c.resume, c.overwrite, world)
        self.files = RunFiles(c.out, self.rank)
        start = train_state.restore(self) if resuming else 0
        rundir.write_run_json(c.out, dataclasses.asdict(c), world, self.topology.local_size,
                              start if resuming else None)
        if self.rank == 0:
            after = f"epoch {start}" + (f", batch {self.partial['batch']}" if self.partial
                                        else "")
            print(f"out: {c.out}" + (f" (resuming after {after})" if resuming else ""),
                  flush=True)
        self.files.start_metrics(self.history)
        self.stop = StopSignal(world, self.rank, self.strategy.stops_between_batches)
        self.stop.install()
        try:
            self._epochs(start)
        finally:
            self.stop.uninstall()  # never collective here: a failing rank must not wait
            self.compute.close()
        self.stop.close()
        return self._finish()

    def _epochs(self, start: int) -> None:
        c = self.config
        for epoch in range(start, c.epochs):
            metrics = self.train_epoch(epoch)
            if metrics is None:  # all ranks stopped between batches on a signal
                self._stopped(train_state.save(self, epoch, self.partial), "between batches")
            self.history.append(metrics)
            self.files.append_metrics(metrics)
            if self.rank == 0:
                self.progress.epoch_done(metrics)
            done = epoch + 1
            signalled = metrics.pop("stop_signal") and done < c.epochs
            stop = bool(c.stop_after) and done - start >= c.stop_after and done < c.epochs
            if signalled or c.checkpoint_every and (done % c.checkpoint_every == 0
                                                    or done == c.epochs or stop):
                path = train_state.save(self, done)
            if signalled:
                self._stopped(path, f"at the end of epoch {done}")
            if stop:
                break

    def _stopped(self, path: str, where: str) -> None:
        got = f"{self.stop.received} on this rank" if self.stop.received else "on another rank"
        raise Stopped(f"rank {self.rank}: stopped on a signal ({got}) {where}; checkpoint "
                      f"'{path}'; continue with --resume", path)

    def train_epoch(self, epoch: int) -> dict[str, Any] | None:
        """One epoch on this rank; returns the epoch's metrics (equal on every rank).

        None: every rank stopped between batches on a signal (``self.partial`` holds
        where). The metrics' ``stop_signal`` says whether a rank has seen one.
        """
        tr, started = self.tracer, time.perf_counter()
        tr.reset()
        self.strategy.begin_epoch(epoch, self.batches)
        self.compute.model.train()
        self.compute.buffers_to_device()
        if self.is_worker:
            done = self._work(epoch)
            self.compute.buffers_to_host()
            if done is None:  # the run's totals go on from here when it resumes
                self._add_totals(time.perf_counter() - started)
                return None
            loss_sum, steps, samples = done
        else:
            self.injector.at_serve(epoch + 1)
            self.strategy.serve()
            loss_sum, steps, samples = 0.0, 0, 0
        self.stop.settle()
        comm = sum(tr.seconds.get(p, 0.0) for p in ("comm_intra", "comm_inter", "wait"))
        seconds = np.array([tr.seconds.get(p, 0.0) for p in PHASES] +
                           [comm, time.perf_counter() - started, self.stop.flag[0]])
        world_max(seconds, self.topology, "epoch timers")
        signalled = bool(seconds[-1])
        seconds = seconds[:-1]
        loss_sum, steps, samples = self._world_sum(np.array([loss_sum, steps, samples]))
        train_loss = float(loss_sum / max(steps, 1))
        self.strategy.end_epoch(epoch, train_loss)
        self._average_buffers()
        wall = float(seconds[-1])
        self._add_totals(wall)
        test_loss, accuracy = self.evaluate()
        metrics = {"epoch": epoch + 1, "train_loss": train_loss, "test_loss": test_loss,
                   "test_accuracy": accuracy, "wall_s": wall, "samples": int(samples),
                   "steps": int(steps), "phases": {p: float(s) for p, s in zip(PHASES, seconds)},
                   "comm_s": float(seconds[-2])}
        stats = broadcast_object(self.strategy.epoch_stats(), self.topology)  # rank 0's
        if stats:
            metrics["strategy"] = stats
        metrics["stop_signal"] = signalled
        return metrics

    def _add_totals(self, seconds: float) -> None:
        """Add the epoch's (or partial epoch's) byte and message counters and wall time."""
        for key in COUNTERS:
            self.totals[key] = self.totals.get(key, 0) + self.tracer.counters.get(key, 0)
        self.totals["elapsed_s"] += seconds

    def _work(self, epoch: int) -> tuple[float, int, int] | None:
        """A worker's epoch: batches of the sizes the strategy gives, until it says stop.

        Returns (loss sum, steps, samples), or None when every rank agreed to stop
        between batches on a signal (``self.partial`` then says where, for the checkpoint).
        """
        tr, c = self.tracer, self.config
        with tr.phase("data"):
            stream = self.data.reader.epoch(epoch, self.batch_size)
        loss_sum, steps, samples, passes = 0.0, 0, 0, 0
        if self.partial:  # resumed between batches: this epoch's first batches are done
            loss_sum, steps, samples = (self.partial[k] for k in ("loss_sum", "steps",
                                                                  "samples"))
            self.strategy.taken, stream.position = steps, steps * self.batch_size
            self.partial = None
        while n := self.strategy.batch_size(self.batch_size):
            with tr.phase("data"):
                self.compute.begin_batch()  # the parameters go up while the batch is read
                batch = stream.take(n)
                if batch is None:  # faster than its share (asynchronous): another pass
                    passes += 1
                    stream.rewind(epoch_rng(c.seed, epoch, self.rank + passes * self.size))
                    batch = stream.take(n)
                if batch is None:
                    raise ValueError(f"rank {self.rank}: batch of {n} samples asked by "
                                     f"{c.strategy}, but this worker's shard holds "
                                     f"{stream.remaining}; use fewer workers or smaller batches")
                x = normalize(batch[0], self.mean, self.std).astype(self.dtype, copy=False)
                x, y = self.compute.inputs(x, batch[1])
            computed = time.perf_counter()
            with tr.phase("forward"):
                loss = F.cross_entropy(self.compute.model(Tensor(x)), y)
            with tr.phase("backward"):
                loss.backward()
                self.compute.gradients_to_host()
                self.totals["steps"] += 1
                self.injector.at_step(self.totals["steps"], self.strategy.flat.grad)
                self._check_gradient(epoch, steps)
                slowdown = max(self.slowdown, self.injector.slow)
                if slowdown > 1:
                    time.sleep((slowdown - 1) * (time.perf_counter() - computed))
            self.strategy.step(steps)
            self.scheduler.step()
            value = loss.item()
            if not np.isfinite(value):
                raise FloatingPointError(f"rank {self.rank}: training loss is {value} at epoch "
                                         f"{epoch + 1}, step {steps}; lower --lr")
            loss_sum, steps, samples = loss_sum + value, steps + 1, samples + n
            self.progress.step(epoch, steps, value)
            if self.stop.between_batches and self.stop.poll():
                self.partial = {"batch": steps, "loss_sum": loss_sum, "steps": steps,
                                "samples": samples}
                return None
        return loss_sum, steps, samples

    def _world_sum(self, values: np.ndarray) -> np.ndarray:
        return allreduce(values.astype(np.float64), self.topology, "mpi")

    def _average_buffers(self) -> None:
        """BatchNorm statistics: averaged over the workers at each epoch's end (one model)."""
        buffers = self.strategy.float_buffers()
        if not buffers:
            return
        flat = np.concatenate([b.reshape(-1) for b in buffers]).astype(np.float64)
        if not self.is_worker:
            flat[...] = 0  # servers hold no statistics of their own
        flat = self._world_sum(flat) / self.topology.num_workers
        offset = 0
        for b in buffers:
            b[...] = flat[offset:offset + b.size].reshape(b.shape)
            offset += b.size

    def evaluate(self) -> tuple[float, float]:
        """(mean loss, accuracy) of the consensus model: each rank its test block, sums reduced."""
        sums = np.zeros(3)
        x_all, y_all, model = self.data.test_x, self.data.test_y, self.compute.model
        with self._consensus_parameters(), no_grad():
            self.compute.parameters_to_device()
            self.compute.buffers_to_device()
            model.eval()
            for i in range(0, len(y_all), 1000):
                x = normalize(x_all[i:i + 1000], self.mean, self.std).astype(self.dtype)
                x, y = self.compute.inputs(x, y_all[i:i + 1000])
                out = model(Tensor(x))
                sums[0] += F.cross_entropy(out, y, reduction="sum").item()
                sums[1] += int((out.data.argmax(axis=1) == y).sum())
                sums[2] += len(y)
        model.train()
        total = self._world_sum(sums)
        return float(total[0] / total[2]), float(total[1] / total[2])

    # -- output ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _consensus_parameters(self) -> Iterator[None]:
        """Inside: the model holds the strategy's consensus parameters; after: its own."""
        flat = self.strategy.flat
        own = flat.data.copy()
        flat.data[...] = self.strategy.consensus()
        try:
            yield
        finally:
            flat.data[...] = own

    def consensus_state(self) -> dict[str, np.ndarray]:
        """The result model's state_dict (the strategy's consensus parameters)."""
        with self._consensus_parameters():
            return {k: np.array(v) for k, v in self.model.state_dict().items()}

    def _finish(self) -> dict[str, Any]:
        state = self.consensus_state()
        counters = np.array([self.totals.get(k, 0) for k in COUNTERS], np.float64)
        totals = self._world_sum(counters)
        summary = self._summary(dict(zip(COUNTERS, totals.astype(int).tolist())))
        self.files.write_results(state, summary)
        self.files.write_trace(self.tracer.events, self.topology.world)
        return summary

    def _summary(self, totals: dict[str, int]) -> dict[str, Any]:
        last = self.history[-1] if self.history else {}
        return {
            "config": dataclasses.asdict(self.config),
            "world_size": self.size, "topology": self.topology.describe(),
            "device": "cpu" if self.device is None else f"cuda:{self.device}",
            "batches_per_epoch": self.batches, "batch_size_per_worker": self.batch_size,
            "versions": dict(versions(), mpi=mpi_library()),
            "threads_per_rank": threads.threads_per_rank(),
            "final": {k: last.get(k) for k in ("epoch", "train_loss", "test_loss",
                                               "test_accuracy")},
            "bytes_sent": {"intra": totals["bytes_intra"], "inter": totals["bytes_inter"]},
            "messages_sent": {"intra": totals["messages_intra"],
                              "inter": totals["messages_inter"]},
            "wall_s": self.totals["elapsed_s"],
            "epochs": self.history,
        }

    # -- checks ---------------------------------------------------------------------------

    def _check_gradient(self, epoch: int, batch: int) -> None:
        """Stop at a non-finite gradient, before the strategy sends or applies it.

        Only the rank that computed it knows: its error ends the job (report_error aborts
        a failure of one rank). The sum is finite in the common case and allocates
        nothing; only a non-finite sum looks for the parameter.
        """
        if np.isfinite(self.strategy.flat.grad.sum()):
            return
        name = train_state.first_non_finite(self.model, "grad")
        if name is not None:
            raise FloatingPointError(
                f"rank {self.rank}: the gradient of parameter {name!r} is not finite at step "
                f"{self.totals['steps']} of the run (epoch {epoch + 1}, batch {batch + 1}); it "
                "was neither sent nor applied, so the last checkpoint holds the last good "
                "state: resume from it, with a lower --lr if the gradients diverged")


def train(config: TrainConfig) -> dict[str, Any]:
    """Run ``config`` on every rank of the world; returns the summary."""
    return Trainer(config).fit()
