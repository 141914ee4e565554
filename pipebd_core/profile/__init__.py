"""The profilers: the rank programs of the `profile` and `profile_finetune` phases.

blocks.py measures every block (teacher, student candidates, sends, all-reduces) on the job's ranks;
layers.py measures every layer of the network the finetune phase trains (F, B, I, W, the co-run curve);
measure.py holds the timing rules both follow. They write profile.json and layer_profile.json, which
planning/ reads; they import nothing from planning/.
"""
