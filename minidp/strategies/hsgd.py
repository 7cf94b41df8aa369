"""``hsgd``: hierarchical synchronous SGD (Wang, Lu, Chen, Li, IEICE Trans. Inf. 2020).

Reconstruction: only the paper's abstract is public. It names three ideas, all here:
first-level replicas on every node that synchronise through shared memory, a second
level across nodes by MPI, and LARS (``--optimizer lars``, minidp/optim/lars.py, where
the trust ratio is computed: per parameter tensor, which the paper calls layer-wise);
its third idea, contiguous parallel I/O, is the ``mpiio`` reader. See docs/hsgd.md for
the choices made.
"""

from __future__ import annotations

from minidp.comm import node_mean, world_mean
from minidp.strategies.base import Option, Strategy


class HierarchicalSGD(Strategy):
    """Two synchronous levels: the node through shared memory, then across nodes.

    Each node runs G first-level replicas (one per rank, one core each, instead of one
    multi-threaded process per node). With ``average="gradients"`` (default) the
    replicas average gradients before one common update; with ``"parameters"`` each
    replica updates with its own gradient and the levels average parameters, level 1
    every ``level1_period`` steps and level 2 every ``level2_period`` steps (a multiple
    of it), i.e. hierarchical local SGD. LARS (optim/lars.py: a trust ratio per
    parameter tensor), nonlinear in the gradient, acts on the averaged gradient in the
    first form and inside each replica's step in the second.

    Communication, at step t (1-based)::

        gradients:  world_mean(grad), hierarchical (comm/allreducers/hierarchical.py):
                    1. node: every rank's gradient is its segment of the node window;
                       local rank k sums slice k of the G segments (shared memory only)
                    2. rails: local rank k allreduces slice k over the P nodes (MPI)
                    3. node: slice k divided by N (the mean) and copied back into every
                       segment; sync; update (SGD or LARS)
        parameters: 1. update with the own gradient
                    2. t % level2_period == 0: world_mean(params), as in 1-3 above
                       (node, then rails)
                       else t % level1_period == 0: node_mean(params), the node only

    Every rank waits at the node sync and (level 2) for its rail. At the end of every
    epoch the parameters are averaged over the world, so evaluation and checkpoints see
    one model. One node: level 2 has nothing to add. Momentum buffers stay per replica.
    """

    name = "hsgd"
    default_rates = (0.02, 0.9)  # momentum SGD, as sync
    stops_between_batches = True
    options = {
        "average": Option("gradients", str, "'gradients' or 'parameters'",
                          lambda v: v in ("gradients", "parameters"),
                          "what the levels average"),
        "level1_period": Option(1, int, "an int >= 1", lambda v: v >= 1,
                                "steps between node (shared-memory) averages"),
        "level2_period": Option(1, int, "an int >= 1, a multiple of level1_period",
                                lambda v: v >= 1, "steps between averages across nodes"),
    }

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        c, rank = self.config, self.topology.rank
        if c["level2_period"] % c["level1_period"]:
            raise ValueError(f"rank {rank}: hsgd.level2_period: got {c['level2_period']}, "
                             f"allowed: a multiple of hsgd.level1_period ({c['level1_period']})")
        if c["average"] == "gradients" and c["level2_period"] != 1:
            raise ValueError(f"rank {rank}: hsgd periods: got level1_period "
                             f"{c['level1_period']}, level2_period {c['level2_period']} with "
                             "average='gradients'; gradient averaging needs both periods 1 "
                             "(replicas would drift apart); use average='parameters'")
        if c["average"] == "gradients":
            self.gradients_in_shared_memory()

    def step(self, batch: int) -> None:
        """One step of the two-level scheme (see the class docstring)."""
        self.steps += 1
        if self.config["average"] == "gradients":
            world_mean(self.grad_buffer, self.topology, "hierarchical")
            self.optimizer_step()
            return
        self.optimizer_step()
        if self.steps % self.config["level2_period"] == 0:
            self.average_parameters()
        elif self.steps % self.config["level1_period"] == 0:
            node_mean(self.flat.data, self.topology)

    def end_epoch(self, epoch: int, train_loss: float) -> None:
        """Average parameters over the world unless the last step just did."""
        if self.config["average"] == "parameters" and self.steps % self.config["level2_period"]:
            self.average_parameters()
        self.check_finite()
