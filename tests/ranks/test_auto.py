"""`schedule.mode: auto` end to end (from a frozen profile, tests/fixtures/tiny_profile.json), and the profile
cache (measured here). Tier: 2-rank gloo runs through torchrun."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipebd_core.documents.profile import Profile
from pipebd_core.job.profiling import obtain_profile
from pipebd_core.planning.profiles import CACHE_ENV, cache_path, profile_key, store
from tests.helpers import assert_same_weights, load_students, plain_loop, run_job, tiny_spec


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_profile_is_measured_once_then_reused(cache: Path) -> None:
    spec = tiny_spec(schedule={"nproc": 2, "profile": True})
    profile, cached = obtain_profile(spec, trials=2)
    assert not cached and cache_path(spec).exists()
    assert profile.batch_sizes == [10, 5] and len(profile.blocks) == 4
    assert profile.blocks[0].student_s[5].median > 0
    assert profile.p2p_s[1][10].trials > 0 and profile.blocks[2].allreduce_s[2].median > 0
    # the replicated student step, its BatchNorm synchronised over both ranks, timed on both at once
    assert all(block.student_group_s[2].trials > 0 and block.student_group_s[2].median > 0 for block in profile.blocks)
    # on CPU, every block's work one after another at each batch (what a training step runs; chain_s)
    # (measured, not compared with the blocks' times: an order of two timings is the machine's load, not an outcome;
    # it failed beside a suite of three test processes)
    assert sorted(profile.chain_s) == [5, 10] and all(chain.trials > 0 for chain in profile.chain_s.values())
    assert all(chain.median > 0 for chain in profile.chain_s.values())
    # float32 boundaries, as the blocks produced them: 3x8x8 input, then 8 or 16 channels (one stride-2 block)
    assert profile.boundary_bytes_per_sample == [4 * 3 * 64, 4 * 8 * 64, 4 * 16 * 64, 4 * 8 * 16, 4 * 16 * 16]
    written = cache_path(spec).stat().st_mtime_ns
    again, cached = obtain_profile(spec)
    # read from the cache, not measured again: a measurement would have written the cached file anew
    assert cached and again == profile and cache_path(spec).stat().st_mtime_ns == written


def test_profile_key_counts_what_the_measurements_depend_on() -> None:
    spec = tiny_spec(schedule={"nproc": 2, "profile": True})
    assert profile_key(tiny_spec(schedule={"nproc": 3, "profile": True})) != profile_key(spec)
    # data-loading times are measured with the spec's loader workers
    assert profile_key(tiny_spec(schedule={"nproc": 2, "profile": True}, data={"num_workers": 2})) != profile_key(spec)
    assert profile_key(tiny_spec(schedule={"nproc": 2, "profile": True}, train={"lr": 0.5})) == profile_key(spec)


# The profile of the spec below, measured once on a 2-core machine: auto plans from it as from a fresh
# measurement (the measurement itself is the test above's), and the same plan whatever else the machine runs.
FROZEN_PROFILE = Path(__file__).parents[1] / "fixtures" / "tiny_profile.json"


def test_auto_plans_from_the_profile_runs_and_trains_the_same_students(cache: Path, tmp_path: Path) -> None:
    spec = tiny_spec(schedule={"mode": "auto", "nproc": 2, "profile": True})
    store(spec, Profile.from_json(json.loads(FROZEN_PROFILE.read_text())))
    code, run_dir = run_job(spec, tmp_path / "run")
    assert code == 0, run_dir.rank_errors()
    plan = run_dir.read_json(run_dir.plan)
    assert plan["mode"] == "auto" and sum(stage["replicas"] for stage in plan["stages"]) == 2
    chosen = [{k: s[k] for k in ("start", "stop", "replicas")} for s in plan["stages"]]
    assert chosen == plan["alternatives"][0]["stages"]
    assert plan["plans_considered"] >= len(plan["alternatives"]) > 1
    assert set(plan["mode_step_s"]) == {"dp", "ls", "ir", "tr", "tr_dpu", "hybrid"}
    assert plan["ideal_step_s"] <= plan["predicted_step_s"]
    segments = plan["simulation"]["chosen"]["segments"]
    assert {s["rank"] for s in segments} == {0, 1} and all(s["end"] >= s["start"] for s in segments)
    assert_same_weights(load_students(run_dir), plain_loop(spec))
