"""The Trainer: data, forward, backward, ``strategy.step()``; evaluation; the run's files.

The loop is driven by data, not by a count. Per epoch, on every rank::

    strategy.begin_epoch
    worker: while n := strategy.batch_size(b):
                data(n) | zero_grad | forward | backward | strategy.step
    server: strategy.serve()             (until every worker's epoch is over)
    every rank: epoch timers and loss reduced -> strategy.end_epoch -> BatchNorm
    statistics averaged over the workers -> evaluation of strategy.consensus() on the
    test set (each rank a contiguous block, sums reduced: :mod:`minidp.run.evaluation`)
    -> metrics.jsonl -> checkpoint

On a GPU (``MINIDP_BACKEND=cupy``) forward and backward run on a replica of the model on
the device (:mod:`minidp.run.replica`): the parameters go up before each batch, the gradients
come down after backward, and everything else (the loop's lines, strategy, optimizer,
checkpoints) is the CPU's, on the host model; the copies are timed in ``data`` and
``backward``.

Phases (``data, forward, backward, comm_intra, comm_inter, wait, optimizer``) are
timed by the tracer; the communication layer reports its own. ``--slowdown RANK:F``
makes a rank's compute F times slower (it sleeps (F-1) x its measured forward and
backward time, inside ``backward``), so stragglers can be shown on one machine.
Outputs (:mod:`minidp.run.files`): ``metrics.jsonl``, ``model.npz`` (the evaluated
model), ``summary.json``, then ``trace.json`` (docs/design.md).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from minidp import Tensor, backend, layers, optim, strategies, threads
from minidp import functional as F
from minidp.comm import (
    Communicator,
    NetworkModel,
    Topology,
    broadcast_object,
    guard,
    mpi_library,
    set_network_model,
    versions,
    world_max,
)
from minidp.comm.network import COUNTED
from minidp.io.training_data import Batches, open_training_data
from minidp.optim import LRScheduler
from minidp.run import evaluation, faults, run_json, rundir
from minidp.run import state as train_state
from minidp.run.config import TrainConfig
from minidp.run.console import Explainer, Progress, explain_steps, first_line
from minidp.run.files import RunFiles
from minidp.run.flags import given_settings
from minidp.run.replica import replica_for
from minidp.run.stopping import StopSignal
from minidp.trace import PHASES, Tracer, set_tracer

COUNTERS = tuple(f"{kind}_{c}" for kind in ("bytes", "messages") for c in COUNTED)


class Trainer:
    """One training run on every rank of ``comm`` (default the world).

    Args:
        config: the checked configuration (:class:`minidp.run.config.TrainConfig`).
        comm: the communicator of the job.
    """

    def __init__(self, config: TrainConfig, comm: Communicator | None = None) -> None:
        self.config = c = config.check()
        if c.comm_timeout is not None:
            guard.set_timeout(c.comm_timeout)
        kind = strategies.strategy_class(c.strategy)  # its facts first, then the strategy
        servers = kind.servers_needed(c.options)
        self.topology = t = Topology(comm, c.ranks_per_node, servers)
        self.rank, self.size, self.is_worker = t.rank, t.size, t.role == "worker"
        self.device = backend.select_device(t.host_rank)
        set_network_model(NetworkModel(c.net_latency_us, c.net_bandwidth_gbps))
        self.tracer = set_tracer(Tracer(self.rank, t.lane()))
        explained = explain_steps(c.explain)
        if explained:  # before the strategy exists: its first broadcast is step 0
            self.tracer.listener = Explainer(t, explained)
        self.batch_size = c.per_worker_batch(t.num_workers)
        self.data = open_training_data(c.dataset, c.data_dir, c.reader, c.seed, c.train_samples,
                                       c.test_samples, t, verify=c.verify)
        self.batches = self.data.batches_per_epoch(self.batch_size)
        self.dtype = np.dtype(c.dtype)
        self.model = self._build_model()
        self.optimizer = optim.make_optimizer(c.optimizer, self.model.parameters(), c.lr,
                                              c.momentum, c.nesterov, c.weight_decay,
                                              c.trust_coefficient)
        if explained and self.rank == 0:
            Explainer.introduce(kind)
        self.strategy = kind(self.model, self.optimizer, t, allreduce=c.allreduce, **c.options)
        notice = self.strategy.ignored_notice(c.options, given_settings(c))
        if notice and self.rank == 0:
            print(notice, flush=True)
        schedule = optim.make_schedule(c.schedule, c.lr, c.epochs * self.batches,
                                       c.warmup_epochs * self.batches)
        self.strategy.plan(c.epochs, self.batch_size, schedule)
        self.scheduler = LRScheduler(self.optimizer, schedule)
        self.compute = replica_for(self.model)  # the model on this rank's GPU, if any
        self.parts = train_state.Parts(self.model, self.strategy, self.optimizer,
                                       self.scheduler)
        self.progress = Progress(self.rank, t.worker_ranks[0], c.progress, c.epochs,
                                 self.batches)
        self.injector = faults.Injector(faults.parse(c.inject_fault), self.rank, self.size,
                                        tuple(t.server_ranks), c.slowdowns())
        self.record = train_state.Record()
        self.stop = StopSignal(t.world, self.rank, self.strategy.stops_between_batches)

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
            Stopped: on every rank, after a SIGTERM, SIGUSR1 or SIGINT
                (:mod:`minidp.run.stopping`): during training the ranks stop at a batch
                boundary and write a checkpoint; before the first batch nothing is written.
            FloatingPointError: the loss or the parameters stopped being finite (exit 4).
        """
        c, world = self.config, self.topology.world
        self.stop.install()
        opened = None
        try:
            try:
                # A signal during start-up stops every rank here, before anything is claimed.
                self.stop.before_training(lambda: rundir.resumable(c.out, c.resume))
                opened = rundir.open_run(c.out, c.resume, c.overwrite, world)
                c.out, self.run_id = opened.path, opened.run_id
                self.files = RunFiles(c.out, self.rank, world, self.run_id)
                start = self._start(opened.resuming)
                self._epochs(start)
            finally:
                self.stop.uninstall()  # never collective here: a failing rank must not wait
                self.compute.close()
            self.stop.close()
            return self._finish()
        finally:  # whatever the outcome, the directory is free for the next job
            if opened is not None and self.rank == 0:
                run_json.release(opened.path, opened.run_id)

    def _start(self, resuming: bool) -> int:
        """Restore the checkpoint when resuming, record the start; returns the first epoch."""
        c, world = self.config, self.topology.world
        start = 0
        if resuming:
            start, self.record = train_state.restore(
                c.out, self.run_id, self.topology, dataclasses.asdict(c), self.parts,
                self.batches, self.data.identity)
        self.files.agreed(run_json.write_run_json, c.out, self.run_id, dataclasses.asdict(c),
                          world, self.topology.local_size, start if resuming else None)
        if self.rank == 0:
            print(first_line(c.out, resuming, start, self.record.partial), flush=True)
        self.files.start_metrics(self.record.history)
        return start

    def _epochs(self, start: int) -> None:
        c = self.config
        for epoch in range(start, c.epochs):
            metrics = self.train_epoch(epoch)
            if metrics is None:  # all ranks stopped between batches on a signal
                raise self.stop.stopped(self._save(epoch), "between batches")
            signal = metrics.pop("stop_signal")
            self.record.history.append(metrics)
            self.files.append_metrics(metrics)
            if self.rank == 0:
                self.progress.epoch_done(metrics)
            done = epoch + 1
            train_state.check_finite(self.model, self.topology, done, metrics["test_loss"],
                                     c.out, self.run_id, c.lr)
            signalled = signal and done < c.epochs
            stop = bool(c.stop_after) and done - start >= c.stop_after and done < c.epochs
            if signalled or c.checkpoint_every and (done % c.checkpoint_every == 0
                                                    or done == c.epochs or stop):
                path = self._save(done)
            if signalled:
                raise self.stop.stopped(path, f"at the end of epoch {done}")
            if signal and not signalled:  # agreed at the last epoch's end: the work is done
                self.stop.finishing()
            if stop:
                break

    def _save(self, epoch: int) -> str:
        """The checkpoint after ``epoch`` epochs (and the record's partial batches)."""
        return train_state.save(self.config.out, self.run_id, epoch, self.topology,
                                dataclasses.asdict(self.config), self.parts, self.record,
                                self.data.identity,
                                after_write=lambda: self.injector.in_save(epoch))

    def train_epoch(self, epoch: int) -> dict[str, Any] | None:
        """One epoch on this rank; returns the epoch's metrics (equal on every rank).

        None: every rank stopped between batches on a signal (``self.record.partial``
        holds where). The metrics' ``stop_signal`` says whether a rank has seen one.
        """
        tr, started = self.tracer, time.perf_counter()
        tr.reset()
        with tr.phase("data"):  # the workers read; every rank checks the files (io/training_data)
            batches = self.data.batches(epoch, self.batch_size, self.dtype, self.config.strategy)
        self.strategy.begin_epoch(epoch, self.batches)
        self.compute.model.train()
        self.compute.buffers_to_device()
        if self.is_worker:
            done = self._work(epoch, batches)
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
                           [comm, time.perf_counter() - started, self.stop.raised])
        world_max(seconds, self.topology, "epoch timers")
        signalled = bool(seconds[-1])
        seconds = seconds[:-1]
        loss_sum, steps, samples = evaluation.world_sum(np.array([loss_sum, steps, samples]),
                                                        self.topology)
        train_loss = float(loss_sum / max(steps, 1))
        self.strategy.end_epoch(epoch, train_loss)
        evaluation.average_buffers(self.strategy, self.topology, self.is_worker)
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
        totals = self.record.totals
        for key in COUNTERS:
            totals[key] = totals.get(key, 0) + self.tracer.counters.get(key, 0)
        totals["elapsed_s"] += seconds

    def _work(self, epoch: int, batches: Batches) -> tuple[float, int, int] | None:
        """A worker's epoch: batches of the sizes the strategy gives, until it says stop.

        Returns (loss sum, steps, samples), or None when every rank agreed to stop
        between batches on a signal (``self.record.partial`` then says where).
        """
        tr, record = self.tracer, self.record
        loss_sum, steps, samples = 0.0, 0, 0
        if record.partial:  # resumed between batches: this epoch's first batches are done
            loss_sum, steps, samples = (record.partial[k] for k in ("loss_sum", "steps",
                                                                    "samples"))
            self.strategy.resume_at(steps)
            batches.skip(steps * self.batch_size)
            record.partial = None
        model = self.compute.model  # the host model, or its replica on this rank's GPU
        while True:
            # Marked before batch_size: a parameter server's pull is the step's first message.
            tr.begin_step(record.totals["steps"] + 1)
            n = self.strategy.batch_size(self.batch_size)
            if not n:
                break
            with tr.phase("data"):
                self.compute.parameters_to_device()  # goes up while the batch is read
                x, y = self.compute.inputs(*batches.take(n))
            computed = time.perf_counter()
            with tr.phase("forward"):
                model.zero_grad()
                loss = F.cross_entropy(model(Tensor(x)), y)
            with tr.phase("backward"):
                loss.backward()
                self.compute.gradients_to_host()
                record.totals["steps"] += 1
                self.injector.at_step(record.totals["steps"], self.strategy.flat.grad,
                                      time.perf_counter() - computed)
                self._check_gradient(epoch, steps)
            self.strategy.step(steps)
            self.scheduler.step()
            value = self._finite_loss(loss, epoch, steps)
            loss_sum, steps, samples = loss_sum + value, steps + 1, samples + n
            self.progress.step(epoch, steps, value)
            if self.stop.between_batches and self.stop.poll():
                record.partial = {"batch": steps, "loss_sum": loss_sum, "steps": steps,
                                  "samples": samples}
                return None
        return loss_sum, steps, samples

    def evaluate(self) -> tuple[float, float]:
        """(mean loss, accuracy) of the consensus model (:func:`evaluation.evaluate`)."""
        return evaluation.evaluate(self.compute, self.data, self.strategy, self.topology,
                                   self.dtype)

    # -- output ---------------------------------------------------------------------------

    def consensus_state(self) -> dict[str, np.ndarray]:
        """The result model's state_dict (the strategy's consensus parameters)."""
        return evaluation.consensus_state(self.model, self.strategy)

    def _finish(self) -> dict[str, Any]:
        state = self.consensus_state()
        counters = np.array([self.record.totals.get(k, 0) for k in COUNTERS], np.float64)
        totals = evaluation.world_sum(counters, self.topology)
        summary = self._summary(dict(zip(COUNTERS, totals.astype(int).tolist())))
        self.files.write_results(state, summary)
        # for minidp replay; after the results, which a failed write must never cost
        self.files.agreed(self.strategy.write_events, self.files.path("events.json"),
                         self.files.run_id)
        self.files.write_trace(self.tracer.finish())
        return summary

    def _summary(self, totals: dict[str, int]) -> dict[str, Any]:
        last = self.record.history[-1] if self.record.history else {}
        return {
            "config": dataclasses.asdict(self.config),
            "world_size": self.size, "topology": self.topology.describe(),
            "device": "cpu" if self.device is None else f"cuda:{self.device}",
            "batches_per_epoch": self.batches, "batch_size_per_worker": self.batch_size,
            "versions": dict(versions(), mpi=mpi_library()),
            "threads_per_rank": threads.threads_per_rank(),
            "final": {k: last.get(k) for k in ("epoch", "train_loss", "test_loss",
                                               "test_accuracy")},
            "bytes_sent": {k: totals[f"bytes_{k}"] for k in COUNTED},
            "messages_sent": {k: totals[f"messages_{k}"] for k in COUNTED},
            "wall_s": self.record.totals["elapsed_s"],
            "epochs": self.record.history,
        }

    # -- checks ---------------------------------------------------------------------------

    def _finite_loss(self, loss: Tensor, epoch: int, batch: int) -> float:
        """The batch's loss as a number; a non-finite one ends the run (lower --lr)."""
        value = loss.item()
        if not np.isfinite(value):
            raise FloatingPointError(f"rank {self.rank}: training loss is {value} at epoch "
                                     f"{epoch + 1}, step {batch}; {self._how_to_continue()}")
        return value

    def _how_to_continue(self) -> str:
        return train_state.how_to_continue(self.config.out, self.run_id, self.config.lr)

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
                f"{self.record.totals['steps']} of the run (epoch {epoch + 1}, batch "
                f"{batch + 1}); it was neither sent nor applied; {self._how_to_continue()}")


def train(config: TrainConfig) -> dict[str, Any]:
    """Run ``config`` on every rank of the world; returns the summary."""
    return Trainer(config).fit()
