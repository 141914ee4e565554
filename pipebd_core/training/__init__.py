"""The end-to-end training phase (`finetune`): the whole network trained on labelled data, then evaluated.

network.py builds what is trained (the compressed network, the searched one, a torchvision classifier
from scratch, or a custom workload's students in order) as a list of layers; plan.py is the contract
the planner writes and the ranks follow (strategy, stage cuts, micro-batches, per-rank action lists);
schedules.py generates those action lists (GPipe, 1F1B, 2BP zero-bubble) as pure functions the
simulator replays; deferred.py splits a backward into input-gradient and batched weight-gradient work;
rank.py is a rank at work (DDP or a pipeline stage); evaluate.py is the `evaluate` phase.
"""
