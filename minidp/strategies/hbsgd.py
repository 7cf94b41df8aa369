"""``hbsgd``: hierarchical bulk-synchronous SGD (Cong & Bhardwaj, ICMLA 2017).

Only the abstract is public. The algorithm is minidp's reconstruction, read through
the same group's K-step averaging paper (K-AVG, Zhou & Cong, IJCAI 2018), which states
that P learners each run K local SGD steps and then a global reduction averages their
parameters (K = 1 being synchronous parallel SGD). Bulk-synchronous gradient averaging
inside a group (here a node) every step, and where momentum lives, are minidp's
choices. See docs/hbsgd.md.
"""

from __future__ import annotations

from minidp.comm import node_mean
from minidp.strategies.base import Option, Strategy


class HierarchicalBulkSGD(Strategy):
    """Gradient averaging inside the node every step; model averaging across nodes every K.

    Within a node the replicas average gradients and take the same step, so they stay
    identical: the node acts as one learner with batch G x b. Across nodes the P
    learners run K local steps, then average their parameters (K-AVG between nodes).
    Momentum buffers are not averaged: each node keeps its own. K-AVG's paper speaks of
    averaging parameters only; keeping the buffers is minidp's choice, and it makes
    K = 1 exactly synchronous SGD (the buffers' average then evolves like the global
    buffer, because the update is linear).

    Communication, at step t (1-based)::

        1. node_mean(grad): through the node's shared window (zero-copy); the node's
           ranks wait for each other
        2. optimizer.step() locally
        3. t % K == 0: world_mean(params), hierarchical (average_parameters; the node
           copies are equal, so this is the mean over nodes; only the rails cross nodes)

    Every epoch ends with step 3 if the last step did not do it, so evaluation and
    checkpoints see one model. One node: K-averaging has nothing to average and this is
    synchronous SGD; one rank per node: K-AVG.
    """

    name = "hbsgd"
    default_rates = (0.02, 0.9)  # momentum SGD, as sync
    stops_between_batches = True
    options = {
        "k": Option(4, int, "an int >= 1", lambda v: v >= 1,
                    "steps between model averages across nodes"),
    }

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gradients_in_shared_memory()

    def step(self, batch: int) -> None:
        """Node gradient average and update; every K steps, the model average across nodes."""
        self.steps += 1
        node_mean(self.grad_buffer, self.topology)
        self.optimizer_step()
        if self.steps % self.config["k"] == 0 and self.topology.num_nodes > 1:
            self.average_parameters()

    def end_epoch(self, epoch: int, train_loss: float) -> None:
        """Leave the epoch with one model on every rank."""
        if self.steps % self.config["k"] and self.topology.num_nodes > 1:
            self.average_parameters()
        self.check_finite()
