"""A profile outside a job (`pipebd profile`, `pipebd plan`, `pipebd bench`): from the cache, or measured
by a job of just the profile phase (or profile_finetune, for a layer profile) in a throw-away run
directory, under the same supervisor as every job."""

from __future__ import annotations

from pipebd_core.documents.layer_profile import LayerProfile
from pipebd_core.documents.phases import PROFILE, PROFILE_FINETUNE
from pipebd_core.documents.profile import Profile
from pipebd_core.job.launch import remove, temporary_run
from pipebd_core.job.outcomes import SUCCEEDED
from pipebd_core.job.supervisor import Supervisor
from pipebd_core.planning.profiles import ProfileError, load_cached, load_cached_layers
from pipebd_core.spec import Spec


def obtain_profile(spec: Spec, refresh: bool = False, trials: int = 5) -> tuple[Profile, bool]:
    """(profile, whether it came from the cache); a measured profile is cached."""
    cached = None if refresh else load_cached(spec)
    if cached is not None:
        return cached, True
    run_dir = temporary_run(spec, [PROFILE])
    try:
        outcome = Supervisor(run_dir, refresh_profile=True, profile_trials=trials).run()
        if outcome.result != SUCCEEDED:
            raise ProfileError(f"profiling {outcome.result} ({outcome.reason}): {outcome.error}")
        return run_dir.load_profile(), False
    finally:
        remove(run_dir)


def obtain_layer_profile(spec: Spec) -> LayerProfile:
    """The layer profile of `spec`'s end-to-end training of a freshly built network: cached, or measured
    now (and cached)."""
    cached = load_cached_layers(spec, None)
    if cached is not None:
        return cached
    run_dir = temporary_run(spec, [PROFILE_FINETUNE])
    try:
        outcome = Supervisor(run_dir).run()
        if outcome.result != SUCCEEDED:
            raise ProfileError(f"layer profiling {outcome.result} ({outcome.reason}): {outcome.error}")
        return run_dir.load_layer_profile()
    finally:
        remove(run_dir)
