"""The end-to-end training phase (`finetune`): the whole network trained on labelled data, then evaluated.

plan.py is the contract the planner writes and the ranks follow (strategy, stage cuts, micro-batches,
per-rank action lists); schedules.py generates those action lists (GPipe, 1F1B, 2BP zero-bubble) as pure
functions the simulator replays; moved.py hands LayerPipe's moved delta shares across a stage boundary;
pipeline.py runs a stage's actions; rank.py is a rank at work (DDP or a pipeline stage); evaluate.py is
the `evaluate` phase. What is trained (rank/network.py) and the split backward (rank/deferred.py) are the
rank toolkit's: the layer profiler measures the same network.
"""
