"""What a job distils: teacher/student block pairs (workload.py builds them from a spec), the CNN
compression and NAS workloads, custom factories, the NAS search space and FLOP counting.

Kept free of imports: readers of the search space (the dashboard) must not load torch.
"""
