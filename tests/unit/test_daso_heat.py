"""Oracles: Heat's DASO, transcribed, against minidp's DASO schedules on random cases.

The two classes below restate what Heat's code does (``helmholtz-analytics/heat``,
``heat/optim/dp_optimizer.py`` at ba1915df655813e95fe8d9bc77916d0f1d29d5c7:
``DASO.epoch_loss_logic``, ``step``, ``_global_sync``, ``_gs_send_params``,
``_gs_rcv_update_params``, ``_gs_rcv_update_params_last_batch``, ``_local_update``;
``heat/optim/utils.py``: ``DetectMetricPlateau``), keeping Heat's structure: its
attribute names, its early returns, one queue of started syncs per local rank. They
are written here, apart from minidp's code, so that a difference in either shows.
``tests/mpi/test_daso.py`` holds the real strategy's trace against :class:`HeatNode`.
"""

import math
import random

import numpy as np

from minidp.strategies.daso_schedule import BatchSchedule, DASOSchedule


class HeatSchedule:
    """``epoch_loss_logic`` + ``DetectMetricPlateau(patience, threshold, "rel", mode="min")``.

    Heat counts ``self.epoch`` up at every epoch's last batch, so the first call sees 1.
    The loss arrives globally averaged and passes through ``torch.tensor`` (float32).
    """

    def __init__(self, total_epochs, warmup_epochs, cooldown_epochs, max_global_skips,
                 skip_reduction_factor, local_skip_factor, stability_level, patience):
        self.total_epochs, self.warmup_epochs = total_epochs, warmup_epochs
        self.cooldown_epochs, self.max_gs = cooldown_epochs, max_global_skips
        self.skip_reduction_factor, self.local_skip_factor = (skip_reduction_factor,
                                                              local_skip_factor)
        self.threshold, self.patience = stability_level, patience
        self.epoch = 0
        self.global_skip = self.local_skip = self.batches_to_wait = 0
        self.best, self.num_bad_epochs = math.inf, 0  # DetectMetricPlateau.reset()

    def test_if_improving(self, current):
        best = self.best
        comp = best * (1.0 - self.threshold) if best >= 0 else best * (1 + self.threshold)
        if current < comp:
            self.best, self.num_bad_epochs = current, 0
        else:
            self.num_bad_epochs += 1
        if self.num_bad_epochs > self.patience:  # (cooldown=0: never in cooldown)
            self.num_bad_epochs = 0
            return True
        return False

    def epoch_loss_logic(self, loss):
        avg_loss = float(np.float32(loss))
        if self.epoch < self.warmup_epochs:
            self.global_skip = self.local_skip = self.batches_to_wait = 0
            return
        elif self.warmup_epochs == self.epoch:
            self.global_skip, self.local_skip, self.batches_to_wait = 4, 1, 1
        if self.epoch >= self.total_epochs - self.cooldown_epochs:
            self.global_skip = self.local_skip = self.batches_to_wait = 0
            return
        self.adjust(self.test_if_improving(avg_loss))

    def adjust(self, stable):
        if stable and self.global_skip > 1:
            self.global_skip //= self.skip_reduction_factor
            self.local_skip //= self.skip_reduction_factor
            self.batches_to_wait -= 1
            if self.global_skip > 0:
                if self.batches_to_wait == 0:
                    self.batches_to_wait = 1
                if self.local_skip == 0:
                    self.local_skip = 1
        elif self.global_skip == 1 and stable:
            self.global_skip = self.max_gs
            self.local_skip = self.max_gs // self.local_skip_factor
            self.batches_to_wait = self.max_gs // self.local_skip_factor

    @property
    def values(self):
        return self.global_skip, self.batches_to_wait, self.local_skip


class HeatNode:
    """``step`` and ``_global_sync`` as one node of ``gpus`` ranks sees them.

    Each batch's record: "n" or "-" (the node's DDP gradient sync was on or off for it),
    then in order "s{rail}w{wait}" (+"c": down-cast) for a send, "m{rail}x{weight}" for
    a merge, "b{root}" for a node broadcast, "a{rail}" for a blocking average, "r" when
    the rails start again at 0.
    """

    def __init__(self, gpus):
        self.loc_gpus = gpus
        self.require_backward_grad_sync = True
        self.current_batch, self.last_batch = 0, None
        self._send_mod, self._send_mod_m1 = 0, None
        self._prev_params = {rank: [] for rank in range(gpus)}  # per local rank: waits
        self.global_skip = self.batches_to_wait = self.local_skip = 0
        self.log = []

    def begin_epoch(self, values, batches):
        self.global_skip, self.batches_to_wait, self.local_skip = values
        self.last_batch = batches - 1

    def step(self):
        self.log = ["n" if self.require_backward_grad_sync else "-"]
        batch = self.current_batch
        next_batch = batch + 1
        gs, ls = self.global_skip, self.local_skip
        gmod = batch % gs if gs > 0 else 0
        lmod = batch % ls if ls > 0 else 0
        btw = (self.batches_to_wait if self.batches_to_wait + batch <= self.last_batch
               else self.last_batch - batch)
        if batch == self.last_batch or gmod == 0:
            self._global_sync(btw)
            return " ".join(self.log)
        if next_batch % gs == 0:
            self.require_backward_grad_sync = True
            self.current_batch += 1
            return " ".join(self.log)
        if gmod < btw:
            self.current_batch += 1
            if next_batch == self.last_batch:
                self.require_backward_grad_sync = True
            return " ".join(self.log)
        elif gmod == btw:
            self._gs_rcv_update_params()
            self._local_update(self._send_mod_m1)
            if ls > 1:
                self.require_backward_grad_sync = False
        if ls == 1 and next_batch != self.last_batch:
            self.current_batch += 1
            self.require_backward_grad_sync = True
            return " ".join(self.log)
        if lmod == 0:
            self.require_backward_grad_sync = False
        elif next_batch % ls == 0:
            self.require_backward_grad_sync = True
        if next_batch == self.last_batch:
            self.require_backward_grad_sync = True
        self.current_batch += 1
        return " ".join(self.log)

    def _global_sync(self, batches_to_wait):
        rail = self._send_mod
        self._prev_params[rail].append(batches_to_wait)  # _gs_send_params on rail's ranks
        self.log.append(f"s{rail}w{batches_to_wait}" + ("c" if self.global_skip < 1 else ""))
        if self.batches_to_wait != 0:
            self._gs_rcv_update_params()
            self._local_update(self._send_mod_m1)
        following = self._send_mod + 1 if self._send_mod <= self.loc_gpus - 2 else 0
        if self.current_batch == self.last_batch or self.batches_to_wait == 0:
            # Heat raises when a rank holds another sync here
            assert [len(q) for q in self._prev_params.values()] == \
                [int(r == rail) for r in range(self.loc_gpus)]
            self._prev_params[rail].pop(0)
            self.log.append(f"a{rail}")
            self._local_update(rail)
            self._send_mod_m1 = None
            if self.current_batch == self.last_batch:
                self._send_mod, self.current_batch = 0, 0
                self.log.append("r")
            else:
                self.current_batch += 1
                self._send_mod = following
        else:
            self.current_batch += 1
            self._send_mod_m1, self._send_mod = self._send_mod, following

    def _gs_rcv_update_params(self):
        if self._send_mod_m1 is None or not self._prev_params[self._send_mod_m1]:
            return
        batches_between = float(self._prev_params[self._send_mod_m1].pop(0))
        numer = batches_between * 2.0 if batches_between > 0.0 else 1.0
        self.log.append(f"m{self._send_mod_m1}x{numer:g}")

    def _local_update(self, sending_process):
        if sending_process is not None:
            self.log.append(f"b{sending_process}")


def describe(plan):
    """minidp's BatchPlan in HeatNode's record format (the order DASO carries it out)."""
    words = ["n" if plan.node_sync else "-"]
    if plan.send:
        words.append(f"s{plan.send.rail}w{plan.send.wait}" + ("c" if plan.send.cast else ""))
    if plan.merge:  # the weight DASO.merge computes from the wait (staleness_weight 2)
        wait = plan.merge.wait
        words.append(f"m{plan.merge.rail}x{2.0 * wait if wait > 0 else 1.0:g}")
    if plan.broadcast is not None:
        words.append(f"b{plan.broadcast}")
    if plan.send and plan.send.blocking:
        words += [f"a{plan.send.rail}", f"b{plan.send.rail}"]
    if plan.rails_reset:
        words.append("r")
    return " ".join(words)


def run_both(gpus, epochs):
    """Records per epoch of minidp's BatchSchedule and HeatNode for [(values, batches)]."""
    mine, heat = BatchSchedule(gpus), HeatNode(gpus)
    got, expected = [], []
    for values, batches in epochs:
        mine.begin_epoch(values, batches)
        heat.begin_epoch(values, batches)
        got.append([describe(mine.plan(b)) for b in range(batches)])
        expected.append([heat.step() for _ in range(batches)])
    return got, expected


SCHEDULE_OPTIONS = dict(max_global_skips=range(1, 17), skip_reduction_factor=range(2, 6),
                        local_skip_factor=range(1, 9))


def reachable_states():
    """Every (B, S, L) some option setting reaches: warm-up, (4, 1, 1), then plateaus."""
    states = {(0, 0, 0)}
    for m in SCHEDULE_OPTIONS["max_global_skips"]:
        for f in SCHEDULE_OPTIONS["skip_reduction_factor"]:
            for k in SCHEDULE_OPTIONS["local_skip_factor"]:
                heat = HeatSchedule(100, 0, 0, m, f, k, 0.05, 2)
                heat.global_skip, heat.batches_to_wait, heat.local_skip = 4, 1, 1
                seen = []
                while heat.values not in seen:
                    seen.append(heat.values)
                    heat.adjust(stable=True)
                states.update(seen)
    return sorted(states)


def random_losses(rng, epochs):
    """Float32 values (Heat's cast is exact): drifts, stalls, exact repeats, sign changes."""
    level, losses = rng.choice([2.0, 0.5, 0.0, -0.5, -3.0]), []
    for _ in range(epochs):
        move = rng.random()
        if move < 0.3 and losses:
            loss = losses[-1]  # equal to the last: never an improvement
        elif move < 0.5:
            loss = level * (1 - rng.choice([0.0, 0.05, 0.049, 0.051]))  # at the threshold
        else:
            level += rng.gauss(-0.05, 0.2)
            loss = level
        losses.append(float(np.float32(loss)))
    return losses


def test_epoch_schedule_equals_heats_on_random_losses():
    rng, runs, differing = random.Random(20), 4000, []
    for run in range(runs):
        options = dict(total_epochs=rng.randint(1, 30), warmup_epochs=rng.randint(0, 4),
                       cooldown_epochs=rng.randint(0, 4),
                       stability_level=rng.choice([0.0, 0.05, 0.2, 0.9, rng.random() * 0.99]),
                       patience=rng.randint(0, 3),
                       **{k: rng.choice(v) for k, v in SCHEDULE_OPTIONS.items()})
        if run < 1000:  # a quarter with Heat's defaults but the lengths
            options.update(max_global_skips=8, skip_reduction_factor=2, local_skip_factor=4,
                           stability_level=0.05, patience=2)
        mine, heat = DASOSchedule(**options), HeatSchedule(**options)
        got, expected = [mine.values], [heat.values]
        for done, loss in enumerate(random_losses(rng, options["total_epochs"]), start=1):
            heat.epoch += 1  # Heat's last batch of the epoch
            heat.epoch_loss_logic(loss)
            got.append(mine.update(done, loss))
            expected.append(heat.values)
        if got != expected:
            differing.append((options, got, expected))
    assert not differing, f"{len(differing)} of {runs} runs differ; first: {differing[0]}"


def test_batch_plans_equal_heats_in_every_reachable_state():
    rng, states = random.Random(21), reachable_states()
    assert len(states) > 40 and (1, -1, 1) in states and (1, 4, 1) in states  # odd ones too
    cases, differing = 0, []
    for state in states:
        for _ in range(12):
            # the state under test between two random ones: the node sync switch and the
            # rails carry over epoch boundaries
            epochs = [(rng.choice(states), rng.randint(1, 50)), (state, rng.randint(1, 50)),
                      (rng.choice(states), rng.randint(1, 50))]
            gpus = rng.randint(2, 8)
            got, expected = run_both(gpus, epochs)
            cases += 1
            if got != expected:
                differing.append((gpus, epochs))
    assert cases == 12 * len(states)
    assert not differing, f"{len(differing)} of {cases} cases differ; first: {differing[0]}"
