"""The host side of one job: preparing its run directory, the supervisor that runs its phases, the
processes it starts, why they failed, progress, calibration and re-planning, stop requests, outcomes.
"""
