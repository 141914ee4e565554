"""The profile cache reads typed profiles: an entry this PipeBD cannot read is a cache miss (measured
again), while an old run directory's profile.json is refused saying why; training's calibration is
written back into it only when the supervisor asks (benchmarks do not). Tier: pure logic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipebd_core.documents.base import DocumentError
from pipebd_core.documents.phases import DISTILL, PLAN
from pipebd_core.documents.telemetry import to_line
from pipebd_core.job.launch import prepare_run
from pipebd_core.job.replan import DistillMonitor
from pipebd_core.planning import profiles
from pipebd_core.planning.distill_planner import resolve_plan
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec
from tests.fake_profiles import fake_profile
from tests.helpers import tiny_spec
from tests.telemetry_lines import distill_line


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(profiles.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_stored_profile_is_read_back_as_it_was() -> None:
    spec = tiny_spec(schedule={"nproc": 2, "profile": True})
    profile = fake_profile([1.0, 2.0, 1.0, 0.5], [0.5] * 4, nproc=2, batch_size=10)
    assert profiles.load_cached(spec) is None
    assert profiles.store(spec, profile) == profiles.cache_path(spec)
    assert profiles.load_cached(spec) == profile


@pytest.mark.parametrize("version", [None, 1, 99], ids=["unversioned", "version-1", "newer"])
def test_a_cache_entry_of_another_format_is_a_miss_then_replaced(version: int | None) -> None:
    spec = tiny_spec(schedule={"nproc": 2, "profile": True})
    profile = fake_profile([1.0, 2.0, 1.0, 0.5], [0.5] * 4, nproc=2, batch_size=10)
    written = {key: value for key, value in profile.to_json().items() if key != "format_version"}
    path = profiles.cache_path(spec)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(written if version is None else {**written, "format_version": version}))
    assert profiles.load_cached(spec) is None  # the profile phase runs again ...
    profiles.store(spec, profile)
    assert profiles.load_cached(spec) == profile  # ... and its measurement replaces the entry


def test_an_old_run_directorys_profile_is_refused_saying_so(tmp_path: Path) -> None:
    run_dir = RunDir(tmp_path / "run")
    run_dir.root.mkdir()
    profile = fake_profile([1.0, 2.0], [0.5, 0.5], nproc=2).to_json()
    run_dir.write_json(run_dir.profile, {key: value for key, value in profile.items() if key != "format_version"})
    with pytest.raises(DocumentError, match="block profile was written without a format version"):
        run_dir.load_profile()


def monitored_run(tmp_path: Path, spec: Spec, store: bool) -> tuple[RunDir, DistillMonitor]:
    """A distill run planned from a profile 100x faster than its ranks' telemetry (1 s a step), launched
    under a monitor; every rank has written 8 steps, which the monitor has not read yet."""
    measured = fake_profile([0.002] * 4, [0.004] * 4, nproc=2, batch_size=10)
    profiles.store(spec, measured)
    run_dir = prepare_run(spec, tmp_path / "run", phases=[PLAN, DISTILL])
    run_dir.write_json(run_dir.profile, measured.to_json())
    run_dir.write_json(run_dir.plan, resolve_plan(spec, measured).to_json())
    monitor = DistillMonitor(run_dir, spec, store_calibration=store)
    monitor.launched()
    for rank in (0, 1):
        run_dir.metrics(rank).parent.mkdir(parents=True, exist_ok=True)
        lines = [to_line(distill_line(rank=rank, step=step, time=100.0 + step)) for step in range(8)]
        run_dir.metrics(rank).write_text("".join(line + "\n" for line in lines))
    return run_dir, monitor


@pytest.mark.parametrize("store", [True, False])
def test_a_calibration_reaches_the_cache_only_when_the_supervisor_stores_it(tmp_path: Path, store: bool) -> None:
    """A benchmark's arms run with store_calibration off: the monitor still calibrates, into its own run
    directory, but the cached profile the next job (or arm) would plan from is left as it was."""
    spec = tiny_spec(schedule={"nproc": 2, "profile": True})
    run_dir, monitor = monitored_run(tmp_path, spec, store)
    monitor.tick()
    assert run_dir.calibration.exists(), "the monitor never calibrated: the check below would prove nothing"
    cached = profiles.load_cached(spec)
    assert cached is not None and (cached.calibration is not None) == store


@pytest.mark.parametrize("exited", [False, True])
def test_ranks_that_exited_are_still_calibrated_from_but_never_replanned(tmp_path: Path, exited: bool) -> None:
    """A short run can end between two polls: the supervisor reads what its ranks wrote last once more
    (tick(exited=True)) and calibrates from it, but considers no re-plan, as nothing is left to run; the
    same lines read while the ranks run weigh one (the profile is 100x off; too few steps are left for it)."""
    spec = tiny_spec(schedule={"nproc": 2, "profile": True, "mode": "auto", "replan": True})
    run_dir, monitor = monitored_run(tmp_path, spec, store=False)
    monitor.tick(exited=exited)
    assert run_dir.calibration.exists()
    events = [json.loads(line)["event"] for line in run_dir.events.read_text().splitlines()]
    weighed = {"replan_requested", "replan_declined"} & set(events)
    assert "calibrated" in events and bool(weighed) == (not exited) and monitor.pending is None


def test_the_layer_profile_times_the_optimiser_step_the_finetune_rank_takes() -> None:
    """Weight decay makes SGD's step allocate a copy of every gradient (0.11 s profiled against 0.8 s run for
    VGG-16's 411 MB classifier layer without it): the layer profile steps the finetune section's optimiser,
    and a profile measured under other settings is not reused for it."""
    from torch import nn

    from pipebd_core.profile.layers import sgd
    from pipebd_core.rank.network import finetune_view

    decayed = tiny_spec(finetune={"microbatches": 2, "weight_decay": 0.001, "momentum": 0.8})
    optimizer = sgd(nn.Linear(4, 4), finetune_view(decayed).train)
    assert (optimizer.defaults["weight_decay"], optimizer.defaults["momentum"]) == (0.001, 0.8)
    plain = tiny_spec(finetune={"microbatches": 2, "weight_decay": 0.0, "momentum": 0.8})
    assert profiles.layer_profile_key(decayed, None) != profiles.layer_profile_key(plain, None)
    assert profiles.layer_profile_key(decayed, None) == profiles.layer_profile_key(
        tiny_spec(finetune={"microbatches": 2, "weight_decay": 0.001, "momentum": 0.8, "lr": 0.5}), None
    )  # the learning rate changes no step's work
