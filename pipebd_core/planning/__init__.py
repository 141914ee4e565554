"""Planning: everything that decides *how* a job runs before it runs, for both phases, named alike.

    distill_costmodel.py  distill_simulate.py  distill_search.py  distill_planner.py  distill_calibration.py
    finetune_simulate.py (its cost model: the replay)  finetune_search.py  finetune_partition.py
    finetune_planner.py  finetune_calibration.py

`*_planner.py` is the phase's plan step (`plan`, `plan_finetune`); `*_search.py` ranks the candidates;
`*_simulate.py` replays a plan's task lists on profiled costs; `*_calibration.py` scales a profile by a
run's measured steps. profiles.py (the cache), topology.py (links between ranks and nodes), trust.py (a
profile's noise) and balance.py (exact small solvers) serve both. The profilers that measure what these
read are rank programs (pipebd_core/profile/); no rank imports planning.
"""
