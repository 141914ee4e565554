"""`pipebd bench` on the tiny workload: the benchmark record, independent arms, one timing rule, the
measured bound, the out-of-sample calibration of `bench --accuracy`, and a bench killed half-way that
resumes. Tier: 2-rank gloo runs through torchrun; ONE bench (dp and tr_dpu, one repeat, and the
one-rank bound) shared by every test here, and the same bench killed after its second run and resumed."""

from __future__ import annotations

import gzip
import json
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from pipebd_core.bench.accuracy import calibrated_prediction, donors, read_run
from pipebd_core.bench.arms import FROZEN_PROFILE, RECORD, WARMUP_STEPS
from pipebd_core.bench.conditions import OutsideTree
from pipebd_core.bench.distill import BOUND_MODE, run_bench
from pipebd_core.documents.bench_record import SHARED_CORES, BenchRecord
from pipebd_core.documents.profile import Profile
from pipebd_core.planning import profiles
from pipebd_core.planning.distill_planner import cost_model, timeline
from pipebd_core.rundir import RunDir
from tests.fake_profiles import fake_profile
from tests.helpers import ROOT, pipebd_here, tiny_document, tiny_spec, write_spec

MODES = ["dp", "tr_dpu"]
STEPS = 8  # per block: 2 warm-up, 6 timed (enough for the monitor's calibration window, which must stay local)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BenchRecord, Path, Path, bytes]]:
    """(record, bench folder, the profile cache's entry, its bytes before the bench)."""
    folder = tmp_path_factory.mktemp("bench")
    spec = tiny_spec(schedule={"nproc": 2, "profile": True})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(profiles.CACHE_ENV, str(folder / "cache"))
        cached = fake_profile([0.002] * 4, [0.004] * 4, nproc=2, batch_size=10)  # never measured in the suite
        entry = profiles.store(spec, cached)
        before = entry.read_bytes()
        record = run_bench(spec, MODES, steps=STEPS, repeats=1, out=folder / "out", keep=True)
        yield record, folder / "out", entry, before


def test_the_record_holds_commit_machine_spec_and_every_run(bench: tuple[BenchRecord, Path, Path, bytes]) -> None:
    record, out, _, _ = bench
    assert BenchRecord.from_json(json.loads((out / RECORD).read_text())) == record
    assert record.commit and len(record.commit.removesuffix("+dirty")) == 40
    assert record.machine.cores >= 1 and record.machine.cpu_model and record.machine.torch
    assert record.machine.cpu_flags is not None
    assert record.reference is not None and record.reference.end is not None  # measured at both ends
    assert record.reference.start.matmul_gflops > 0 and record.reference.end.conv_gflops > 0
    assert record.spec["name"] == "tiny" and record.nproc == 2 and record.steps == STEPS
    assert [arm.name for arm in record.arms] == MODES
    for arm in record.arms:
        (run,) = arm.runs
        assert len(run.step_s) == STEPS - WARMUP_STEPS and all(seconds > 0 for seconds in run.step_s)
        assert run.measured_step_s == pytest.approx(statistics.fmean(run.step_s))
        assert run.predicted_step_s is not None and run.predicted_step_s > 0
        assert run.load.wall_s > 0 and run.load.other_cores >= 0
        assert run.load.shared == (run.load.other_cores > SHARED_CORES)
        assert len(run.peak_mem_bytes) == 2
    assert record.arms[0].runs[0].stages == [] and len(record.arms[1].runs[0].stages) == 2  # dp; tr_dpu's stages


def test_every_arm_planned_from_the_same_frozen_profile(bench: tuple[BenchRecord, Path, Path, bytes]) -> None:
    record, out, _, _ = bench
    frozen = Profile.from_json(json.loads((out / FROZEN_PROFILE).read_text()))
    assert frozen.digest() == record.profile_hash
    for arm in record.arms:
        assert [run.profile_hash for run in arm.runs] == [record.profile_hash]
        assert RunDir(out / f"{arm.name}-0").load_profile() == frozen


def test_no_arm_writes_calibration_another_reads(bench: tuple[BenchRecord, Path, Path, bytes]) -> None:
    record, out, entry, before = bench
    assert entry.read_bytes() == before, "an arm wrote its calibration into the profile cache"
    assert sorted(path.name for path in entry.parent.iterdir()) == [entry.name]
    for arm in record.arms:
        run_dir = RunDir(out / f"{arm.name}-0")
        assert run_dir.load_profile().calibration is None
        plan = run_dir.read_json(run_dir.plan)
        assert plan.get("replans", []) == [] and run_dir.load_spec().schedule.replan is False


def test_every_mode_is_timed_by_one_rule(bench: tuple[BenchRecord, Path, Path, bytes]) -> None:
    record, _, _, _ = bench
    timings = [run.timing for arm in record.arms for run in arm.runs] + [run.timing for run in record.bound.runs]
    assert timings == [record.timing] * len(timings)
    assert record.timing.warmup_steps == WARMUP_STEPS and record.timing.timed_steps == STEPS - WARMUP_STEPS


def test_the_bound_is_measured_on_one_rank(bench: tuple[BenchRecord, Path, Path, bytes]) -> None:
    record, out, _, _ = bench
    (run,) = record.bound.runs
    assert run.profile_hash is None and len(run.peak_mem_bytes) == 1  # one rank, planned without a profile
    assert [(s.start, s.stop, s.replicas) for s in run.stages] == [(0, 4, 1)]
    assert RunDir(out / "bound-0").load_spec().schedule.mode == BOUND_MODE
    assert record.bound.t1_s == run.measured_step_s > 0
    assert record.bound.ideal_s == pytest.approx(record.bound.t1_s / 2)
    assert record.bound.profile_ideal_s is not None and record.bound.profile_ideal_s > 0


def test_calibration_from_one_arms_run_predicts_another(bench: tuple[BenchRecord, Path, Path, bytes]) -> None:
    """The out-of-sample mechanism of `bench --accuracy` on the bench's real runs: each arm's own plan
    re-predicted from the frozen profile gives its plan phase's prediction, and with the OTHER arm's
    calibration.json it gives another figure than with its own."""
    record, out, _, _ = bench
    frozen = Profile.from_json(json.loads((out / FROZEN_PROFILE).read_text()))
    reads = {arm.name: read_run(out / f"{arm.name}-0") for arm in record.arms}
    calibrations = {name: read.calibration for name, read in reads.items()}
    assert all(calibrations.values()), "every arm's run calibrated (its calibration.json)"
    given = donors(MODES, {name for name, calibration in calibrations.items() if calibration})
    assert given == {"dp": "tr_dpu", "tr_dpu": "dp"}
    spec = RunDir(out / "tr_dpu-0").load_spec()
    for arm in record.arms:
        plan, donor = reads[arm.name].plan, given[arm.name]
        assert timeline(plan, cost_model(spec, frozen)).step_s == pytest.approx(arm.runs[0].predicted_step_s)
        own, other = calibrations[arm.name], calibrations[donor or ""]
        assert own is not None and other is not None and own.source.run == f"{arm.name}-0" != other.source.run
        out_of_sample = calibrated_prediction(plan, spec, frozen, other)
        assert out_of_sample != calibrated_prediction(plan, spec, frozen, own)
        assert out_of_sample != arm.runs[0].predicted_step_s


def runs_in(record: BenchRecord) -> list[tuple[str, int, str]]:
    """(arm, repeat, stages) of every run a record holds, the bound's last."""
    arms = [(arm.name, arm.runs) for arm in record.arms] + [("bound", record.bound.runs)]
    return [(name, run.repeat, str(run.stages)) for name, runs in arms for run in runs]


def test_a_bench_killed_after_its_second_run_resumes_to_the_uninterrupted_record(
    bench: tuple[BenchRecord, Path, Path, bytes], tmp_path: Path
) -> None:
    """The module's bench again as `pipebd bench` (the same spec and cached profile), killed with SIGTERM
    once its record holds two runs, then `pipebd bench --resume` on that record: the runs and the profile
    of the uninterrupted bench, the two runs done before the kill kept as they were."""
    whole = bench[0]
    spec = write_spec(tmp_path, tiny_document(schedule={"nproc": 2, "profile": True}))
    out, started = tmp_path / "killed", time.monotonic()
    command = [sys.executable, "-m", "pipebd_core.cli", "bench", str(spec), "--modes", ",".join(MODES)]
    command += ["--steps", str(STEPS), "--repeats", "1", "--out", str(out)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while not (out / RECORD).exists() or len(runs_in(load(out / RECORD))) < 2:
            assert process.poll() is None, f"the bench ended before its second run: {process.communicate()[1]}"
            assert time.monotonic() - started < 300, "the bench's first two runs took over 5 minutes"
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=120) != 0
    finally:
        process.kill()
    stopped = load(out / RECORD)
    assert runs_in(stopped) == runs_in(whole)[:2] and stopped.runs_left == ["bound-0"]
    code, _, err = pipebd_here("bench", "--resume", str(out / RECORD))
    assert code == 0, err
    resumed = load(out / RECORD)
    assert resumed.complete and resumed.profile_hash == whole.profile_hash
    assert runs_in(resumed) == runs_in(whole)
    assert [arm.runs for arm in resumed.arms] == [arm.runs for arm in stopped.arms]  # kept, not run again
    assert resumed.reference is not None and stopped.reference is not None
    assert resumed.reference.start == stopped.reference.start and resumed.reference.end is not None
    code, _, err = pipebd_here("bench", "--resume", str(out / RECORD))
    assert code == 2 and "the bench is complete" in err


def load(path: Path) -> BenchRecord:
    return BenchRecord.from_json(json.loads(path.read_text()))


def test_report_check_recomputes_every_prediction_and_fails_when_the_committed_profile_is_edited(
    bench: tuple[BenchRecord, Path, Path, bytes], tmp_path: Path
) -> None:
    """The bench's record and frozen profile committed as a page's records are (NAME.json beside
    NAME.profile.json.gz): every prediction recomputes; an edited profile, or an edited prediction, fails."""
    _, out, _, _ = bench
    code, printed, err = pipebd_here("bench", "--report", str(out / RECORD), "--check")
    assert code == 0 and "every prediction recomputed" in printed, err
    record, profile = tmp_path / "tiny.json", tmp_path / "tiny.profile.json.gz"
    record.write_bytes((out / RECORD).read_bytes())
    profile.write_bytes(gzip.compress((out / FROZEN_PROFILE).read_bytes()))
    assert pipebd_here("bench", "--report", str(record), "--check")[0] == 0
    edited = json.loads((out / FROZEN_PROFILE).read_text())
    for timing in edited["blocks"][0]["teacher_s"].values():
        timing["median"] *= 1.5
    profile.write_bytes(gzip.compress(json.dumps(edited).encode()))
    code, _, err = pipebd_here("bench", "--report", str(record), "--check")
    assert code == 1 and "it was edited" in err
    profile.write_bytes(gzip.compress((out / FROZEN_PROFILE).read_bytes()))
    document = json.loads(record.read_text())
    document["arms"][1]["runs"][0]["predicted_step_s"] *= 1.01
    record.write_text(json.dumps(document))
    code, _, err = pipebd_here("bench", "--report", str(record), "--check")
    assert code == 1 and "tr_dpu repeat 0: the record says" in err
    (tmp_path / "tiny.profile.json.gz").unlink()
    code, _, err = pipebd_here("bench", "--report", str(record), "--check")
    assert code == 1 and "no frozen profile committed beside" in err


def test_minutes_that_hold_no_bench_are_refused_before_any_run(
    bench: tuple[BenchRecord, Path, Path, bytes], tmp_path: Path
) -> None:
    """`--minutes` with the module's cached profile: half a minute holds no 3 repeats of 3 arms' start-ups,
    and the refusal says what would (nothing ran: no run folder)."""
    spec = write_spec(tmp_path, tiny_document(schedule={"nproc": 2, "profile": True}))
    out = tmp_path / "fitted"
    code, _, err = pipebd_here("bench", str(spec), "--modes", "dp,tr_dpu", "--minutes", "0.5", "--out", str(out))
    assert code == 2 and "--minutes 0.5: 3 arms x 3 repeats need at least" in err, err
    assert sorted(path.name for path in out.iterdir()) == ["frozen-profile.json"]


def test_outside_tree_counts_a_backend_only_from_when_it_opened() -> None:
    """A backend already serving the bench's database (a pool's connection, busy filling it) before the window
    opened: the CPU it used before is not the window's, or the other processes' load would read too low."""
    token = f"pipebd_test_{uuid.uuid4().hex[:12]}"
    code = "import sys, time\nend = time.process_time() + 0.4\nwhile time.process_time() < end: pass\nsys.stdin.read()"
    busy = subprocess.Popen([sys.executable, "-c", code, token], stdin=subprocess.PIPE)
    try:
        process = psutil.Process(busy.pid)
        deadline = time.monotonic() + 60
        while sum(process.cpu_times()[:2]) < 0.4 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = OutsideTree(f"postgresql://127.0.0.1/{token}")
        time.sleep(0.5)  # sampled while it waits, using nothing
        counted = tree.seconds()
    finally:
        assert busy.stdin is not None
        busy.stdin.close()
        busy.wait(30)
    assert tree.used and counted < 0.2, (tree.used, counted)  # seen, but its 0.4 s before are not counted
