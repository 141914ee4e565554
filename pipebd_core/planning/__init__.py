"""Planning: probe, profiler, profiles, cost model, planner, simulator and plan resolution.

Everything that decides *how* a job runs before it runs. The runtime (a rank at work) imports none
of it; the launcher, the CLI and the benchmark do.
"""
