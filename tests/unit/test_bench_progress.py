"""Benchmarks that fit and resume, without running anything: the rotation that skips the runs a record
holds and reports every run as it ends, `--minutes`' choice of steps and repeats, the report of a record
with runs left, and `--resume`'s refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipebd_core.bench import progress
from pipebd_core.bench.arms import rotate, rotation, timing_rule
from pipebd_core.bench.fit import (
    LAUNCH_S,
    MIN_REPEATS,
    MIN_STEPS,
    SCALE_LIMITS,
    Budget,
    Probe,
    budget,
    fit,
    predicted_s,
    probing,
)
from pipebd_core.bench.progress import read_record
from pipebd_core.bench.report import render
from pipebd_core.documents.bench_record import ArmRun, BenchRecord, KernelSpeed, Reference, RunSpeed
from pipebd_core.spec import Spec, SpecError
from tests.helpers import pipebd_here, tiny_spec
from tests.unit.bench_samples import measured_run

RECORD = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "record.json"
ARMS = ["dp", "tr_dpu", "bound"]


def paced_record() -> BenchRecord:
    """The fixture record as if timed by today's rule (it was committed before the pace: bench/arms.py)."""
    record = BenchRecord.from_json(json.loads(RECORD.read_text()))
    return record.model_copy(update={"timing": timing_rule(record.timing.warmup_steps, record.timing.timed_steps)})


def made_run(name: str, repeat: int) -> ArmRun:
    """A run whose figures say which arm and repeat made it."""
    seconds = ARMS.index(name) + repeat / 10
    return measured_run(repeat, seconds)


class Stopped(Exception):
    pass


def test_the_rotation_resumed_from_what_was_written_runs_the_rest_in_the_same_order(tmp_path: Path) -> None:
    arms = dict.fromkeys(ARMS, tiny_spec())
    order: list[tuple[str, int]] = []
    written: list[tuple[dict[str, list[ArmRun]], list[str]]] = []

    def run(name: str, arm: Spec, folder: Path, repeat: int) -> ArmRun:
        if len(order) == 4:  # killed during the fifth run
            raise Stopped
        order.append((name, repeat))
        return made_run(name, repeat)

    def write(runs: dict[str, list[ArmRun]], left: list[str]) -> None:
        written.append(({name: list(done) for name, done in runs.items()}, left))

    with pytest.raises(Stopped):
        rotate(arms, 2, tmp_path, False, run, written=write)
    assert order == rotation(ARMS, 2)[:4] == [("dp", 0), ("tr_dpu", 0), ("bound", 0), ("tr_dpu", 1)]
    assert [left for _, left in written] == [
        ["dp-0", "tr_dpu-0", "bound-0", "tr_dpu-1", "bound-1", "dp-1"],  # before the first run
        ["tr_dpu-0", "bound-0", "tr_dpu-1", "bound-1", "dp-1"],
        ["bound-0", "tr_dpu-1", "bound-1", "dp-1"],
        ["tr_dpu-1", "bound-1", "dp-1"],
        ["bound-1", "dp-1"],
    ]
    done = written[-1][0]
    order.clear()
    resumed = rotate(arms, 2, tmp_path, False, lambda n, a, f, r: order.append((n, r)) or made_run(n, r), done)
    assert order == [("bound", 1), ("dp", 1)]
    whole = rotate(arms, 2, tmp_path, False, lambda n, a, f, r: made_run(n, r))
    assert resumed == whole


def test_minutes_choose_steps_and_repeats_within_the_budget() -> None:
    step_s = {"dp": 0.5, "tr_dpu": 0.3, "bound": 0.6}
    chosen = fit(step_s, minutes=5, max_steps=40)
    assert chosen.repeats >= MIN_REPEATS and MIN_STEPS <= chosen.steps <= 40
    assert chosen.predicted_s == predicted_s(step_s, chosen.steps, chosen.repeats) <= 5 * 60
    assert predicted_s(step_s, chosen.steps + 1, chosen.repeats) > 5 * 60  # as many steps as fit
    assert chosen.predicted_s == chosen.repeats * (3 * LAUNCH_S + chosen.steps * 1.4)
    assert "steps a run" in chosen.says() and f"{chosen.repeats} repeats of 3 arms" in chosen.says()
    roomy = fit(step_s, minutes=30, max_steps=10)  # the steps asked for fit with room: more repeats
    assert roomy.steps == 10 and roomy.repeats > MIN_REPEATS and roomy.predicted_s <= 30 * 60
    with pytest.raises(SpecError, match=r"--minutes 1: 3 arms x 3 repeats need at least 4 minutes"):
        fit(step_s, minutes=1, max_steps=40)
    few = fit(step_s, minutes=4, max_steps=4)  # fewer steps asked for than MIN_STEPS: those, if they fit
    assert few.steps == 4 and few.predicted_s <= 4 * 60


def test_a_bench_s_budget_is_the_steps_asked_for_or_those_its_minutes_fit_said_on_stderr(
    capsys: pytest.CaptureFixture[str],
) -> None:
    step_s = {"dp": 0.5, "tr_dpu": 0.3, "bound": 0.6}
    asked: list[int] = []

    def predicted() -> dict[str, float]:
        asked.append(1)
        return step_s

    assert budget(40, 3, None, None, predicted) == Budget(40, 3, None) and asked == []  # predicted for --minutes only
    resumed = BenchRecord.model_construct(fitted="--minutes 5: what it chose")  # a resumed record keeps its choice
    assert budget(12, 4, None, resumed, predicted) == Budget(12, 4, "--minutes 5: what it chose")
    assert capsys.readouterr().err == ""
    chosen = fit(step_s, minutes=5, max_steps=40)
    assert budget(40, 3, 5, None, predicted) == Budget(chosen.steps, chosen.repeats, chosen.says()) and asked == [1]
    assert capsys.readouterr().err == f"pipebd: {chosen.says()}\n"


def test_a_record_with_runs_left_reports_itself_incomplete_and_resume_refuses_what_it_cannot(tmp_path: Path) -> None:
    whole = paced_record()
    first = whole.arms[0].model_copy(update={"runs": whole.arms[0].runs[:1]})
    bound = whole.bound.model_copy(update={"runs": [], "t1_s": None, "ideal_s": None})
    stopped = whole.model_copy(update={"arms": [first], "bound": bound, "runs_left": ["bound-0", "dp-1"]})
    text = render([stopped])
    assert "Incomplete: 1 runs done, 2 left (bound-0, dp-1)" in text and "s/step" not in text
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(whole.to_json()))
    code, _, err = pipebd_here("bench", "--resume", str(path))
    assert code == 2 and "the bench is complete" in err
    path.write_text(json.dumps(stopped.to_json()))  # no frozen profile beside it
    code, _, err = pipebd_here("bench", "--resume", str(path))
    assert code == 2 and "frozen profile" in err and "cannot be read" in err
    code, _, err = pipebd_here("bench", "examples/tiny-custom.yaml", "--resume", str(path))
    assert code == 2 and "give no spec" in err


def test_again_shared_takes_the_shared_runs_out_and_runs_them_again_in_their_place(tmp_path: Path) -> None:
    measured = paced_record()  # its tr_dpu-1 was measured shared
    quiet = [arm.model_copy(update={"runs": [run for run in arm.runs if not run.load.shared]}) for arm in measured.arms]
    whole = measured.model_copy(update={"arms": quiet})
    dp = whole.arms[0]
    busy = dp.runs[0].load.model_copy(update={"other_cores": 0.9, "shared": True})
    marked = dp.model_copy(update={"runs": [dp.runs[0].model_copy(update={"load": busy}), *dp.runs[1:]]})
    shared = whole.model_copy(update={"arms": [marked, *whole.arms[1:]]})
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(shared.to_json()))
    again = read_record(path, again_shared=True)
    assert again.runs_left == [f"{dp.name}-0"]
    assert [run.repeat for run in again.arms[0].runs] == [run.repeat for run in dp.runs[1:]]
    assert again.arms[1:] == whole.arms[1:] and again.bound == whole.bound  # the quiet runs are kept
    path.write_text(json.dumps(whole.to_json()))
    with pytest.raises(ValueError, match=r"complete .* and no run of it was measured shared"):
        read_record(path, again_shared=True)
    arms = dict.fromkeys(ARMS, tiny_spec())
    done = {name: [made_run(name, 0), made_run(name, 1)] for name in ARMS}
    done["dp"] = [made_run("dp", 1)]  # dp-0 taken out: measured again, it goes back before dp-1
    rerun = rotate(arms, 2, tmp_path, False, lambda n, a, f, r: made_run(n, r), done)
    assert [run.repeat for run in rerun["dp"]] == [0, 1]


def test_the_reference_speed_is_taken_after_each_run_and_a_run_measured_again_drops_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Progress measures the reference speed once after each run that ends (not again for those done), and a
    resume with --again-shared keeps the speeds after the runs it keeps, not after those it measures again."""
    counted = iter(range(1, 100))
    monkeypatch.setattr(progress, "reference_speed", lambda: KernelSpeed(matmul_gflops=next(counted), conv_gflops=1))
    start = KernelSpeed(matmul_gflops=0.0, conv_gflops=1.0)
    measuring = progress.Progress(tmp_path, object(), "hash", start, {})  # type: ignore[arg-type]
    seen: list[dict[str, float]] = []

    def write(runs: dict[str, list[ArmRun]], left: list[str]) -> None:
        measuring.measure_after(runs)
        seen.append({name: speed.matmul_gflops for name, speed in measuring.after_runs.items()})

    rotate(dict.fromkeys(ARMS, tiny_spec()), 2, tmp_path, False, lambda n, a, f, r: made_run(n, r), written=write)
    assert seen[0] == {} and seen[1] == {"dp-0": 1.0} and seen[2] == {"dp-0": 1.0, "tr_dpu-0": 2.0}
    assert list(seen[-1]) == [f"{name}-{repeat}" for name, repeat in rotation(ARMS, 2)]
    reference = measuring.reference(ended=True)
    assert [speed.run for speed in reference.after_runs] == list(seen[-1]) and reference.end == KernelSpeed(
        matmul_gflops=7, conv_gflops=1
    )

    measured = paced_record()  # its tr_dpu-1 was measured shared
    names = [f"{arm.name}-{run.repeat}" for arm in measured.arms for run in arm.runs]
    names += [f"bound-{run.repeat}" for run in measured.bound.runs]
    after = [RunSpeed(run=name, speed=start) for name in names]
    with_speeds = measured.model_copy(update={"reference": Reference(start=start, after_runs=after)})
    kept = progress.speeds_kept(progress.without_shared(with_speeds))
    assert "tr_dpu-1" in names and sorted(kept) == sorted(set(names) - {"tr_dpu-1"})


def test_a_probe_run_measures_the_start_up_and_scales_the_predictions_the_fit_uses() -> None:
    step_s = {"dp": 0.5, "tr_dpu": 0.3, "bound": 0.6}
    probe = Probe("dp", 6, wall_s=30.0, step_s=1.0, predicted_step_s=0.5)  # 24 s beyond its steps, 2x predicted
    assert (probe.launch_s, probe.scale) == (24.0, 2.0)
    assert Probe("dp", 6, 30.0, 10.0, 1.0).scale == SCALE_LIMITS[1] and Probe("dp", 6, 30.0, 1.0, None).scale == 1
    chosen = fit(step_s, minutes=10, max_steps=100, probe=probe)
    scaled = {arm: 2 * step for arm, step in step_s.items()}
    assert chosen.predicted_s == predicted_s(scaled, chosen.steps, chosen.repeats, 24.0) + 30.0 <= 10 * 60
    assert predicted_s(scaled, chosen.steps + 1, chosen.repeats, 24.0) + 30.0 > 10 * 60  # as many steps as fit
    assert "24 s start-up a run" in chosen.says() and "x 2.00" in chosen.says() and "6-step run of dp" in chosen.says()
    with pytest.raises(SpecError, match=r"--minutes 1, 70 s of them spent on a probe run of dp: nothing is left"):
        fit(step_s, minutes=1, max_steps=40, probe=Probe("dp", 6, 70.0, 1.0, 0.5))
    with pytest.raises(SpecError, match=r"--minutes 2, 30 s of them spent on a probe run of dp .*: --minutes 1.5"):
        fit(step_s, minutes=2, max_steps=40, probe=probe)


def test_the_probe_measures_the_second_of_two_runs_and_counts_both(tmp_path: Path) -> None:
    """The first run of a bench pays what the later ones find done (the agent server's imports): a probe
    measured on it saw a start-up three times what the runs then took, and fitted too few repeats."""
    walls = iter([8.0, 3.0])  # a cold run, then a warm one: 6 steps at 0.05 s each
    folders: list[Path] = []

    def run(steps: int, folder: Path) -> ArmRun:
        folders.append(folder)
        done = measured_run(0, 0.05, timed_steps=steps)
        return done.model_copy(update={"load": done.load.model_copy(update={"wall_s": next(walls)})})

    probe = probing(tmp_path, "dp", run)(6)
    assert len(folders) == 2 and not folders[0].exists()
    assert (probe.wall_s, probe.counted_s, probe.launch_s) == (3.0, 11.0, pytest.approx(2.7))
    chosen = fit({"dp": 0.05, "bound": 0.08}, minutes=1, max_steps=40, probe=probe)
    assert chosen.predicted_s == pytest.approx(predicted_s({"dp": 0.05, "bound": 0.08}, 40, chosen.repeats, 2.7) + 11.0)
    assert "(11 s with the run before it, counted in the minutes)" in chosen.says()


def test_a_fitted_bench_probes_once_and_only_a_budget_the_fastest_start_up_could_hold() -> None:
    step_s = {"dp": 0.5, "tr_dpu": 0.3, "bound": 0.6}
    probed: list[int] = []

    def probe(steps: int) -> Probe:
        probed.append(steps)
        return Probe("dp", steps, 30.0, 1.0, 0.5)

    chosen = fit(step_s, minutes=10, max_steps=40, probe=Probe("dp", MIN_STEPS, 30.0, 1.0, 0.5))
    assert budget(40, 3, 10, None, lambda: step_s, probe) == Budget(chosen.steps, chosen.repeats, chosen.says())
    assert probed == [MIN_STEPS]
    with pytest.raises(SpecError, match=r"--minutes 0.5: 3 arms x 3 repeats need at least"):
        budget(40, 3, 0.5, None, lambda: step_s, probe)  # 9 runs of 5 s start-up each: refused, nothing run
    assert probed == [MIN_STEPS]
    assert budget(4, 3, 10, None, lambda: step_s, probe).steps == 4 and probed[-1] == 4  # --steps below MIN_STEPS


def test_a_fresh_bench_measures_the_reference_speed_just_before_and_right_after_its_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The speed around the profile is what a miss sets the runs' speeds beside (bench/misses.py)."""
    order: list[str] = []
    speeds = iter([10.0, 20.0, 30.0])

    def speed() -> KernelSpeed:
        order.append("speed")
        return KernelSpeed(matmul_gflops=next(speeds), conv_gflops=1.0)

    def measure() -> str:
        order.append("profile")
        return "profile"

    monkeypatch.setattr(progress, "reference_speed", speed)
    monkeypatch.setattr(progress, "freeze", lambda profile, out: "hash")
    started = progress.begin(tmp_path, None, measure, str)
    assert order == ["speed", "profile", "speed"]
    reference = started.reference(ended=True)
    assert reference.after_profile is not None and reference.end is not None
    assert (reference.start.matmul_gflops, reference.after_profile.matmul_gflops, reference.end.matmul_gflops) == (
        10.0,
        20.0,
        30.0,
    )
