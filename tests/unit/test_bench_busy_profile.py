"""A distillation bench plans every arm from one profile (bench/distill.py `frozen_profile`): a cached profile
measured on a busy machine (planning/trust.py's `busy`) is refused, naming its file and `--reprofile`, the flag
that measures it again; one measured quiet is used as cached; `--reprofile` is refused where it means nothing.
Tier: pure logic (no profile is measured)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipebd_core.bench.distill import frozen_profile
from pipebd_core.documents.profile import Conditions, Profile
from pipebd_core.planning import profiles
from pipebd_core.planning.profiles import ProfileError
from tests.fake_profiles import fake_profile
from tests.helpers import pipebd_here, tiny_spec


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(profiles.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def measured_under(other_cores: float) -> Profile:
    """A profile as the profiler writes it, taken while other processes used `other_cores` cores."""
    profile = fake_profile([1.0, 2.0, 1.0, 0.5], [0.5] * 4, nproc=2, batch_size=10)
    conditions = Conditions(cpus=2, other_cpu_cores=other_cores, load_average_1m=1.0, noisy_spread=0.1)
    return profile.model_copy(update={"conditions": conditions})


def test_a_cached_profile_measured_busy_is_refused_naming_it_and_the_flag_that_measures_it_again() -> None:
    spec = tiny_spec(schedule={"nproc": 2, "profile": True})
    path = profiles.store(spec, measured_under(0.95))
    with pytest.raises(ProfileError) as refused:
        frozen_profile(spec)
    message = str(refused.value)
    assert f"the cached profile {path} was measured on a busy machine" in message
    assert "other processes used 0.95 CPU cores" in message and "`pipebd bench --reprofile`" in message


def test_a_cached_profile_measured_quiet_is_what_every_arm_plans_from() -> None:
    spec = tiny_spec(schedule={"nproc": 2, "profile": True})
    profiles.store(spec, measured_under(0.1))
    assert frozen_profile(spec) == measured_under(0.1).uncalibrated()


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["examples/tiny-custom.yaml", "--phase", "finetune"], "block profile of a distillation bench"),
        (["examples/tiny-custom.yaml", "--replan"], "--replan measures its own"),
        (["--resume", "runs/bench/x/bench.json"], "--reprofile starts a bench afresh"),
    ],
)
def test_reprofile_is_refused_where_no_cached_profile_is_read(extra: list[str], said: str) -> None:
    code, _, err = pipebd_here("bench", *extra, "--reprofile")
    assert code == 2 and said in err
