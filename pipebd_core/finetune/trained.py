"""The finetune phase's trained network read back from its checkpoints: every stage's saved layers loaded into
the whole network, as the rank's periodic evaluation, the evaluate phase and the tests read it.

Kept apart from the rank (rank.py) so that a process that only reads the result (evaluate) does not import
torch.distributed.pipelining, which the pipeline strategies' stages need (a second of CPU per process)."""

from __future__ import annotations

from pipebd_core.finetune.plan import TrainPlan
from pipebd_core.rank import checkpoint
from pipebd_core.rank.network import Network
from pipebd_core.rundir import RunDir


def load_trained(network: Network, run_dir: RunDir, plan: TrainPlan, step_done: int) -> None:
    """Every stage's checkpoint after `step_done` steps into the whole network's layers."""
    for unit, (start, stop) in enumerate(plan.stages):
        state = checkpoint.load_block(run_dir.finetune_checkpoints, unit, step_done)
        network.sequential(start, stop).load_state_dict(state["module"])
