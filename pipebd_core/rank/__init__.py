"""The rank toolkit: what every rank program (distill, finetune, the profilers, finalize, evaluate) shares.

process.py (process group, device, the phase entry and its error files), checkpoint.py, telemetry.py
(the telemetry writer and memory readings), metrics.py (top-1 and perplexity), students.py (a student
block at work) and batchnorm.py (cross-rank BatchNorm), learning_rate.py, faults.py (fault-injection
hooks), and the end-to-end network that the
finetune phase trains and its profiler measures: network.py, channels.py, deferred.py.

It imports the ground floor (spec, rundir, documents), data/ and workloads/, never a phase's program,
planning/ or the host side (job/, bench/, tracking/): tests/unit/test_layers.py checks it.
"""
