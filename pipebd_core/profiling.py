"""A profile outside a job (`pipebd profile`, `pipebd plan`): from the cache, or measured by a job of
just the profile phase in a throw-away run directory, under the same supervisor as every job."""

from __future__ import annotations

from typing import Any

from pipebd_core.launch import remove, temporary_run
from pipebd_core.outcomes import SUCCEEDED
from pipebd_core.phases import PROFILE
from pipebd_core.planning.profiles import ProfileError, load_cached
from pipebd_core.spec import Spec
from pipebd_core.supervisor import Supervisor


def obtain_profile(spec: Spec, refresh: bool = False, trials: int = 5) -> tuple[dict[str, Any], bool]:
    """(profile, whether it came from the cache); a measured profile is cached."""
    cached = None if refresh else load_cached(spec)
    if cached is not None:
        return cached, True
    run_dir = temporary_run(spec, [PROFILE])
    try:
        outcome = Supervisor(run_dir, refresh_profile=True, profile_trials=trials).run()
        if outcome.result != SUCCEEDED:
            raise ProfileError(f"profiling {outcome.result} ({outcome.reason}): {outcome.error}")
        profile: dict[str, Any] = run_dir.read_json(run_dir.profile)
        return profile, False
    finally:
        remove(run_dir)
