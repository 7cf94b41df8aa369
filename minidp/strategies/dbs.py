"""``dbs``: ASGD with performance-aware dynamic batch sizes (Ji, Zhang, Fu, Gao, Li 2019).

Ji, Zhang, Fu, Gao, Li, "Performance-Awareness Based Dynamic Batch Size SGD for
Distributed Deep Learning Framework", J. Computer Research and Development 56(11):
2396-2409, 2019 (DOI 10.7544/issn1000-1239.2019.20180880). Only the abstract is public:
it modulates each node's batch size "according to the runtime performance of each
node" so that fast and slow nodes take the same time per iteration, against stale
gradients. Everything below is minidp's reconstruction (``docs/dbs.md`` lists every
choice):

* measure: each push carries the worker's batch and its compute time (pull to push,
  including any slowdown); the server keeps an exponential moving average of each
  worker's throughput v_i (samples/s, factor ``ema``);
* allocate: every ``rebalance_every`` gradients (default: one per worker), server 0
  sets b_i as near to proportional to v_i as the bounds [``min_batch``, ``max_batch``]
  allow, with the total fixed at workers x ``--batch-size`` (the fixed-batch run's)
  (:func:`proportional_sizes`); the new b_i goes out with the worker's next pull;
* update (``update=each``, the default): ASGD, each gradient applied as it arrives,
  weighted by its share of samples, w <- w - lr * ((b_i / b) * g_i + wd * w) (g_i the
  mean over b_i samples, b the base batch), so a sample counts the same whichever worker
  took it. ``update=round``: equal iteration times let the server take one gradient
  from every worker per update without anybody waiting long, so it does, and answers
  their next pulls after that update: every gradient is fresh (staleness 0),
  w <- w - lr * sum_i b_i g_i / sum_i b_i with ``--momentum`` at the server, i.e.
  synchronous SGD on the round's samples, of which the straggler takes a small share.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from minidp.optim.schedules import Schedule
from minidp.strategies.base import Option
from minidp.strategies.ps_base import ParameterServer


def clamped_shares(speeds: list[Fraction], total: int, low: int, high: int) -> list[Fraction]:
    """s_i = clamp(lam * v_i, low, high) summing to ``total``, exactly (rational numbers).

    F(lam) = sum_i clamp(lam v_i, low, high) rises continuously from n low to n high, so
    the scale lam exists when n low <= total <= n high. Each pass shares what the fixed
    sizes leave among the free ones in proportion to their speeds; then the side whose
    violations are larger in total is fixed at its bound: if the shares below ``low``
    miss more than those above ``high`` exceed, F(lam) > total, so the true lam is
    smaller and those sizes stay below ``low`` (and the other way round). Fixing only
    one side is what keeps the sum: the first version fixed the single worst size, and
    a fast worker's share fixed at ``high`` could leave the others nothing to share.
    """
    fixed: dict[int, Fraction] = {}
    scale = Fraction(0)
    while len(fixed) < len(speeds):
        free = [i for i in range(len(speeds)) if i not in fixed]
        scale = (total - sum(fixed.values())) / sum(speeds[i] for i in free)
        below = [i for i in free if scale * speeds[i] < low]
        above = [i for i in free if scale * speeds[i] > high]
        if not below and not above:
            break
        missing = sum(low - scale * speeds[i] for i in below)
        excess = sum(scale * speeds[i] - high for i in above)
        if missing >= excess:
            fixed.update((i, Fraction(low)) for i in below)
        if excess >= missing:
            fixed.update((i, Fraction(high)) for i in above)
    return [fixed.get(i, scale * v) for i, v in enumerate(speeds)]


def proportional_sizes(speeds: np.ndarray, total: int, low: int, high: int) -> np.ndarray:
    """Integer sizes summing to ``total``, each in [low, high], near proportional to ``speeds``.

    The target is the clamped proportional share s_i (:func:`clamped_shares`); each
    size is floor(s_i), plus one for the largest remainders (ties: the lower index)
    until the sum is ``total``, so |b_i - s_i| < 1 and a faster worker never gets less.

    Raises:
        ValueError: no split exists (``total`` outside [n low, n high]), or a speed is
            not a finite number > 0.
    """
    speeds = np.asarray(speeds, dtype=np.float64)
    n = len(speeds)
    if not n * low <= total <= n * high:
        raise ValueError(f"batch sizes: a total of {total} cannot be split into {n} sizes in "
                         f"[{low}, {high}]")
    if np.any(~np.isfinite(speeds)) or np.any(speeds <= 0):
        raise ValueError(f"speeds: got {speeds.tolist()}, allowed: finite numbers > 0")
    shares = clamped_shares([Fraction(float(v)) for v in speeds], total, low, high)
    sizes = [math.floor(s) for s in shares]
    order = sorted(range(n), key=lambda i: (sizes[i] - shares[i], i))  # largest remainder
    for i in order[:total - sum(sizes)]:
        sizes[i] += 1
    return np.array(sizes, np.int64)


class DynamicBatchSGD(ParameterServer):
    """ASGD whose per-worker batch sizes follow each worker's measured speed.

    Communication: as :class:`ParameterServer`; the batch size b_i rides on server 0's
    answer to every pull (the first field of the reply header), the worker's compute
    time on every push. With b_i proportional to v_i every worker's iteration takes
    about b_i / v_i = B / sum(v).

    ``update=each``: nobody waits for anybody but the server; gradients arrive in turn
    and every staleness is about workers - 1, instead of large for slow workers and
    small for fast ones. With equal speeds this is ``asgd``.

    ``update=round``: each server holds the pull of a worker whose gradient is already
    in the open round, and answers it right after the round's update; the round is
    complete when every worker still in the epoch has pushed. Workers wait for the
    slowest iteration of each round, which the balanced sizes keep short. With fixed
    sizes this is synchronous SGD on workers x b samples.
    """

    name = "dbs"
    default_rates = (0.02, 0.0)  # the server applies plain SGD: --momentum is unused
    options: ClassVar[dict[str, Option]] = dict(
        ParameterServer.options,
        min_batch=Option(0, int, "an int >= 0 (0: a quarter of --batch-size, at least 1)",
                         lambda v: v >= 0),
        max_batch=Option(0, int, "an int >= 0 (0: 4 x --batch-size)", lambda v: v >= 0),
        rebalance_every=Option(0, int, "gradients between re-allocations, >= 0 (0: one per "
                               "worker)", lambda v: v >= 0),
        ema=Option(0.9, float, "a number in [0, 1): weight of the old throughput estimate",
                   lambda v: 0 <= v < 1),
        update=Option("each", str, "each (every gradient at once, as asgd) or round (one "
                      "gradient of every worker per update, staleness 0)",
                      lambda v: v in ("round", "each")))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        workers = self.topology.worker_ranks
        self.speeds = {r: 0.0 for r in workers}
        self.sizes: dict[int, int] = {}
        self.allocated_speeds = dict(self.speeds)  # the speeds the sizes were computed from
        self.since_rebalance = 0
        self.history: list[list[int]] = []  # the sizes after each re-allocation this epoch
        self.round_mode = self.config["update"] == "round"
        self.server_momentum = self.round_mode  # a round is a synchronous step: sync's momentum
        self.round: dict[int, int] = {}  # worker -> samples, for this round's gradients
        self.held: list[tuple[int, int]] = []  # pulls answered when the round is applied
        if self.round_mode and self.topology.role == "server":
            self.round_grads = {w: np.empty_like(self.incoming) for w in workers}
            self.sum = np.empty_like(self.incoming)

    ignored_hint = ("update=each applies plain SGD at the server; --set dbs.update=round "
                    "uses --momentum")

    @classmethod
    def ignored_flags(cls, options: dict[str, Any]) -> tuple[str, ...]:
        """``update=each`` applies plain SGD: ``--momentum`` and ``--nesterov`` are unused."""
        return () if options["update"] == "round" else ("momentum", "nesterov")

    def plan(self, total_epochs: int, base_batch: int = 1,
             lr_schedule: Schedule | None = None) -> None:
        """Check the batch bounds against --batch-size before training starts."""
        super().plan(total_epochs, base_batch, lr_schedule)
        self.bounds()

    def bounds(self) -> tuple[int, int]:
        """(min_batch, max_batch) with their defaults resolved against --batch-size.

        The sizes must sum to workers x b in [min_batch, max_batch] each: possible exactly
        when the range holds b. Checked in :meth:`plan`, so a run that could not be split
        is refused before training, never in the serve loop.
        """
        base = self.base_batch
        low = self.config["min_batch"] or max(1, base // 4)
        high = self.config["max_batch"] or 4 * base
        if not low <= base <= high:
            raise ValueError(f"rank {self.topology.rank}: dbs.min_batch/max_batch: got "
                             f"[{low}, {high}], allowed: a range holding --batch-size {base} "
                             f"(the {self.topology.num_workers} sizes must sum to "
                             f"{self.topology.num_workers} x {base})")
        return low, high

    def assign_batch(self, worker: int, wanted: int) -> int:
        """This worker's current b_i (the base batch until its speed is known)."""
        return self.sizes.get(worker, self.base_batch)

    def observe(self, worker: int, samples: int, compute_s: float) -> None:
        """Update the worker's throughput; every ``rebalance_every`` pushes, re-allocate."""
        speed = samples / max(compute_s, 1e-6)
        old = self.speeds[worker]
        self.speeds[worker] = speed if old == 0 else self.config["ema"] * old + \
            (1 - self.config["ema"]) * speed
        self.since_rebalance += 1
        period = self.config["rebalance_every"] or self.topology.num_workers
        if self.topology.rank == 0 and self.since_rebalance >= period and \
                all(self.speeds.values()):
            self.since_rebalance = 0
            workers = list(self.speeds)
            low, high = self.bounds()
            sizes = proportional_sizes(np.array([self.speeds[r] for r in workers]),
                                       self.base_batch * len(workers), low, high)
            self.sizes = dict(zip(workers, sizes.tolist()))
            self.allocated_speeds = dict(self.speeds)
            self.history.append(sizes.tolist())

    def on_gradient(self, worker: int, grad: np.ndarray, staleness: int, samples: int) -> None:
        """``each``: an ASGD step weighted by b_i / b. ``round``: keep it for the round."""
        if not self.round_mode:
            self.apply(grad, samples / self.base_batch)
            return
        self.round_grads[worker][:] = grad
        self.round[worker] = samples
        self.close_round()

    def reply_from(self, server: int) -> list[int]:
        """``round``: a held pull waits on the server and, through the round, on the others."""
        others = [w for w in self.topology.worker_ranks if w != self.topology.rank]
        return super().reply_from(server) + (others if self.round_mode else [])

    def holds(self, worker: int) -> bool:
        """``round``: whether ``worker``'s pull waits for the round's update.

        A scripted order skips such a worker: it has nothing to send until the update.
        """
        return any(held == worker for held, _ in self.held)

    def on_pull(self, worker: int, wanted: int) -> None:
        """``round``: a worker that gave this round its gradient waits for the update."""
        if worker in self.round:
            self.held.append((worker, wanted))
        else:
            self.answer(worker, wanted)

    def leave(self, worker: int) -> None:
        """A worker that leaves may be the one the round was waiting for."""
        super().leave(worker)
        if self.round_mode:
            self.close_round()

    def close_round(self) -> None:
        """Once every worker still in the epoch has pushed: one update, then the pulls.

        The round's gradients are summed in rank order (not arrival order), so a run's
        bits do not depend on which worker came first.
        """
        if not self.round or any(w not in self.round for w in self.active):
            return
        total = sum(self.round.values())
        self.sum[...] = 0
        for worker in sorted(self.round):
            kept = self.round_grads[worker]
            kept *= self.round[worker] / total  # in place: no array allocated per round
            self.sum += kept
        self.apply(self.sum, 1.0)
        self.round.clear()
        held, self.held = self.held, []
        for worker, wanted in held:
            self.answer(worker, wanted)

    def begin_epoch(self, epoch: int, batches: int) -> None:
        """Start the epoch's record of allocations (the sizes themselves carry over)."""
        super().begin_epoch(epoch, batches)
        self.history = []

    def epoch_stats(self) -> dict[str, Any]:
        """ASGD's statistics plus the current sizes and the epoch's re-allocations."""
        stats = super().epoch_stats()
        if self.topology.rank == 0:
            stats["batch_sizes"] = {str(r): self.assign_batch(r, 0) for r in self.speeds}
            stats["throughput"] = {str(r): v for r, v in self.allocated_speeds.items()}
            stats["reallocations"] = len(self.history)
        return stats

    def state_dict(self) -> dict[str, Any]:
        """ASGD's state plus speeds and sizes (JSON keys are strings)."""
        return dict(super().state_dict(), speeds={str(r): v for r, v in self.speeds.items()},
                    sizes={str(r): b for r, b in self.sizes.items()},
                    allocated={str(r): v for r, v in self.allocated_speeds.items()},
                    since_rebalance=self.since_rebalance)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state)
        self.speeds = {int(r): float(v) for r, v in state["speeds"].items()}
        self.sizes = {int(r): int(b) for r, b in state["sizes"].items()}
        self.allocated_speeds = {int(r): float(v) for r, v in state["allocated"].items()}
        self.since_rebalance = int(state["since_rebalance"])
