"""Typed documents: every one round-trips through JSON, and refuses another format version or none.

`SAMPLES` holds one filled-in instance of every `Document` subclass in pipebd_core/documents; a
document without a sample fails `test_every_document_has_a_sample`, so a new one cannot skip the checks.
"""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
from pathlib import Path

import pytest

import pipebd_core.documents
from pipebd_core.documents.architecture import Architecture, ArchitectureBlock, CandidateResult
from pipebd_core.documents.base import Document, DocumentError
from pipebd_core.documents.bench_record import BenchRecord, ReplanBenchRecord
from pipebd_core.documents.calibration import BlockCalibration, Calibration, CalibrationSource
from pipebd_core.documents.choice import ChoiceRecord
from pipebd_core.documents.control import StopAt
from pipebd_core.documents.distill_plan import PlanDocument
from pipebd_core.documents.errors import RankError
from pipebd_core.documents.layer_profile import LayerBatches, LayerProfile, LayerProfileEntry, LayerTimes
from pipebd_core.documents.nodes import NodeEnd, NodeLaunch, NodeToken
from pipebd_core.documents.phases import PhaseRecord, PhasesRecord
from pipebd_core.documents.profile import BlockProfile, Conditions, Profile, Timing
from pipebd_core.documents.step import StepAnswer, StepRequest
from pipebd_core.documents.summary import FinetuneReport, ModelSize, Summary
from pipebd_core.documents.telemetry import (
    BlockSeconds,
    DistillLine,
    EvalLine,
    FinetuneLine,
    parse_line,
    read_line,
    step_line,
    to_line,
)
from pipebd_core.documents.webhook import WebhookJob, WebhookPayload, WebhookPhase
from pipebd_core.rundir import RunDir
from tests.helpers import tiny_spec
from tests.unit.plan_samples import FINETUNE_SAMPLE, PLAN_SAMPLE
from tests.unit.test_tradeoff_report import record as tradeoff_record

CALIBRATION = Calibration(
    blocks=[
        BlockCalibration(teacher=1.5, student=0.8, teacher_s=0.003, student_s=0.004, batch=8, tasks=12),
        BlockCalibration(),
    ],
    data=1.2,
    allreduce=2.0,
    task_overhead_s=0.0005,
    measured_step_s=0.0125,
    source=CalibrationSource(run="run-1", steps=[2, 40], stages=[{"start": 0, "stop": 1, "replicas": 1}], at=100.0),
)


def timing(median: float) -> Timing:
    return Timing(median=median, spread=0.1, trials=5, remeasured=1)


def block_profile(peak: bool) -> BlockProfile:
    return BlockProfile(
        teacher_s={8: timing(0.002), 4: timing(0.001)},
        student_s={8: timing(0.004), 4: timing(0.002)},
        student_arch_s={8: Timing(median=0.0), 4: Timing(median=0.0)},
        saved_bytes={8: 8000, 4: 4000},
        student_peak_bytes={8: 9000, 4: 4500} if peak else None,
        teacher_param_bytes=4000,
        student_param_bytes=400,
        allreduce_s={2: timing(0.0003)},
    )


PROFILE = Profile(
    nproc=2,
    batch_size=8,
    batch_sizes=[8, 4],
    device="cpu",
    device_memory_bytes=2**33,
    baseline_bytes=2**28,
    shapes=[[3, 8, 8], [8, 8, 8], [16, 4, 4]],
    boundary_bytes_per_sample=[768, 2048, 1024],
    blocks=[block_profile(peak=True), block_profile(peak=False)],
    data_s={8: timing(0.001), 4: timing(0.0005)},
    p2p_s=[{8: timing(0.0001), 4: timing(0.00005)}] * 3,
    measured_at=50.0,
    conditions=Conditions(
        cpus=2, other_cpu_cores=0.2, load_average_1m=1.5, gpu_other_processes=[[123], []], noisy_spread=0.5
    ),
    calibration=CALIBRATION,
)

LAYER_TIMES = LayerTimes(
    F=timing(0.001),
    B=timing(0.002),
    I=timing(0.0012),
    W=timing(0.0009),
    optim=timing(0.0001),
    I_kernel=timing(0.0011),
    I_halves=timing(0.0013),
    saved_bytes=4096,
)
LAYER_PROFILE = LayerProfile(
    nproc=2,
    batches=LayerBatches(microbatch=2, shard=4),
    device="cpu",
    device_memory_bytes=2**33,
    shapes=[[3, 8, 8], [8, 8, 8]],
    layers=[
        LayerProfileEntry(
            microbatch=LAYER_TIMES,
            shard=LAYER_TIMES.model_copy(update={"I_kernel": None, "I_halves": None}),
            output_bytes_per_sample=2048,
            input_bytes_per_sample=768,
            param_bytes=900,
            weight_bytes=864,
        )
    ],
    p2p_s={4096: timing(0.0002), 864: timing(0.00005)},
    allreduce_s=timing(0.0004),
    measured_at=60.0,
)

# benchmark records: one written by hand, one of a tiny `--replan` run
BENCH_FIXTURES = Path(__file__).parents[1] / "fixtures" / "bench"

SAMPLES: list[Document] = [
    StepRequest(step="plan", spec={"name": "a-job"}, run_dir="/runs/a-job"),
    StepAnswer(error="PlanError", message="schedule.nproc: 3 ranks but the batch of 8 does not split"),
    StepAnswer(result={"mode": "tr", "nproc": 2}),
    RankError(
        rank=1, time=12.5, type="ValueError", message="bad block", traceback="Traceback ...\nValueError: bad block"
    ),
    PhasesRecord(
        phases=[
            PhaseRecord(name="plan", runs="local", state="ended", outcome="succeeded", started_at=1.0, ended_at=2.0),
            PhaseRecord(name="distill", runs="torchrun", state="running", started_at=2.0, outputs=["checkpoints/"]),
        ]
    ),
    PROFILE,
    LAYER_PROFILE,
    CALIBRATION,
    DistillLine(
        time=5.5,
        rank=1,
        epoch=0,
        step=3,
        round="arch",
        blocks=[2, 3],
        loss={2: 0.5, 3: 0.25},
        phases={"recv_wait": 0.01, "teacher": 0.02, "student": 0.03, "optim": 0.001},
        block_s=BlockSeconds(teacher={2: 0.01, 3: 0.01}, student={2: 0.015, 3: 0.016}),
        samples=12,
        peak_mem=2048,
        cur_mem=1024,
        done=4,
        total=8,
        skipped=2,
        paths={2: [[1, 0]]},
        gpu_util=40,
        arch={2: [[0.25, 0.75]], 3: None},
    ),
    FinetuneLine(
        time=7.0,
        rank=1,
        epoch=1,
        step=9,
        times={"F": 0.01, "B": 0.02, "I": 0.0, "W": 0.0, "send": 0.0, "recv_wait": 0.003, "optim": 0.001, "idle": 0.0},
        elapsed=0.034,
        loss=1.5,
        acc=0.25,
        samples=12,
        peak_mem=4096,
        cur_mem=2048,
        done=10,
        total=16,
        timeline=[("F", 0, 0.0, 0.01), ("allreduce", None, 0.02, 0.03)],
        w_calls=4,
        moved_combined=2,
        moved_computed=0,
    ),
    EvalLine(time=8.0, rank=0, epoch=2, step=15, top1=0.75),
    Summary(
        name="nas-then-tune",
        mode="auto",
        nproc=2,
        steps_per_block=40,
        final_loss={0: 0.5, 1: 0.25},
        warnings=["the teacher's weights are random"],
        architecture=[ArchitectureBlock(block=0, layers=["mbconv_k3_e3", "zero"])],
        student_top1=None,  # measured: the data set has no labels
        teacher_top1=0.5,
        finetune=FinetuneReport(
            strategy="zb",
            top1_before=0.25,
            top1_after=0.75,
            student=ModelSize(params=1000, flops=2e6),
            teacher_top1=0.8,
            teacher=ModelSize(params=5000, flops=9e6),
            phase_s={"distill": 12.5, "finetune": 3.0, "evaluate": None},
        ),
    ),
    ChoiceRecord(
        index=2,
        budget={"params": 0.4, "kv_cache": 0.25},
        layers=["ffn_1/4", "kv_1", "noop"],
        chosen_by="lowest summed held-out loss within the budget (mixed-integer program)",
        reached={"params": 0.38, "kv_cache": 0.25},
        perplexity=212.5,
        seconds=3.2,
    ),
    Architecture(
        blocks=[ArchitectureBlock(block=0, layers=["ffn_1/2"], loss=0.25, params=600, kv_cache_bytes=64)],
        candidates=[
            CandidateResult(block=0, name="keep", loss=0.0, params=1000, kv_cache_bytes=64),
            CandidateResult(block=0, name="ffn_1/2", loss=0.25, params=600, kv_cache_bytes=64),
            CandidateResult(block=0, name="linear_attention", loss=0.4, params=1128, kv_cache_bytes=0),
        ],
        chosen_by="lowest summed held-out loss within the budget (mixed-integer program)",
        teacher_params=1000,
        teacher_kv_cache_bytes=64,
        budget={"params": 0.6},
        reached={"params": 0.6, "kv_cache": 1.0},
    ),
    PLAN_SAMPLE,
    FINETUNE_SAMPLE,
    WebhookPayload(
        event="phase.finished",
        time="2026-12-02T08:00:00Z",
        text="PipeBD job 3 (tiny): phase distill failed in 2.0 s (rank_error)",
        job=WebhookJob(
            id=3,
            name="tiny",
            state="running",
            phase="distill",
            progress=0.5,
            termination_reason=None,
            error=None,
            url="https://pipebd.example.com/jobs/3",
        ),
        phase=WebhookPhase(name="distill", outcome="failed", reason="rank_error", duration_s=2.0),
    ),
    BenchRecord.from_json(json.loads((BENCH_FIXTURES / "record.json").read_text())),
    ReplanBenchRecord.from_json(json.loads((BENCH_FIXTURES / "replan-record.json").read_text())),
    tradeoff_record(["ffn_1/2", "noop"]),  # benchmarks/tradeoff.py's
    StopAt(step=6),
    StopAt(task=3),
    NodeToken(run_id="job-7-1", node=1, host="gpu-02", pid=4242),
    NodeLaunch(run_id="job-7-1", launch=2, phase="distill", endpoint="10.0.0.1:29500"),
    NodeLaunch(run_id="job-7-1", launch=3, done=True, result="succeeded"),
    NodeEnd(run_id="job-7-1", launch=2, node=1, result="failed", reason="rank_killed", error="a rank was killed"),
]


def documents() -> list[type[Document]]:
    """Every Document subclass defined in the pipebd_core.documents package."""
    for module in pkgutil.iter_modules(pipebd_core.documents.__path__):
        importlib.import_module(f"pipebd_core.documents.{module.name}")
    found, stack = [], list(Document.__subclasses__())
    while stack:
        kind = stack.pop()
        found.append(kind)
        stack.extend(kind.__subclasses__())
    return [kind for kind in found if kind.__module__.startswith("pipebd_core.documents.")]


def test_every_document_has_a_sample() -> None:
    sampled = {type(sample) for sample in SAMPLES}
    missing = [kind.__name__ for kind in documents() if kind not in sampled]
    assert missing == [], f"add a sample of {', '.join(missing)} to SAMPLES"


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda sample: type(sample).__name__)
def test_a_document_round_trips_through_json(sample: Document) -> None:
    written = json.loads(json.dumps(sample.to_json()))
    assert written["format_version"] == type(sample).VERSION
    assert type(sample).from_json(written) == sample


@pytest.mark.parametrize("sample", SAMPLES, ids=lambda sample: type(sample).__name__)
def test_a_document_of_another_version_is_refused_naming_both(sample: Document) -> None:
    kind = type(sample)
    newer = {**sample.to_json(), "format_version": kind.VERSION + 1}
    with pytest.raises(DocumentError, match=rf"{kind.NAME} was written as version {kind.VERSION + 1}.*reads version"):
        kind.from_json(newer)
    unversioned = {key: value for key, value in sample.to_json().items() if key != "format_version"}
    with pytest.raises(DocumentError, match="without a format version"):
        kind.from_json(unversioned)


def test_an_old_phases_json_is_refused_saying_so() -> None:
    """phases.json before documents were versioned was a bare list."""
    with pytest.raises(DocumentError, match=r"phases\.json was written without a format version"):
        PhasesRecord.from_json([{"name": "plan", "runs": "local"}])


def test_an_old_profile_json_is_refused_saying_so() -> None:
    """profile.json before documents were versioned: the same fields, without `format_version`."""
    old = {key: value for key, value in PROFILE.to_json().items() if key != "format_version"}
    with pytest.raises(DocumentError, match=r"block profile was written without a format version .*run its spec again"):
        Profile.from_json(old)


def test_a_profile_keeps_its_tables_keyed_by_batch_and_its_calibration() -> None:
    written = json.loads(json.dumps(PROFILE.to_json()))
    assert list(written["blocks"][0]["teacher_s"]) == ["8", "4"]  # JSON keys: the per-replica batch
    read = Profile.from_json(written)
    assert read.blocks[0].teacher_s[4].median == 0.001 and read.blocks[1].student_peak_bytes is None
    assert read.calibration == CALIBRATION and read.uncalibrated().calibration is None
    assert read.uncalibrated().calibrated(CALIBRATION) == read


def test_a_telemetry_line_is_one_compact_line_without_absent_fields_and_reads_back_by_phase() -> None:
    distill, finetune, evaluation = (
        next(s for s in SAMPLES if isinstance(s, kind)) for kind in (DistillLine, FinetuneLine, EvalLine)
    )
    quiet = EvalLine(time=8.0, rank=0, epoch=2, step=15)  # no labels: no top-1
    text = to_line(quiet)
    assert text.endswith("\n") and text.count("\n") == 1 and ": " not in text and "top1" not in text
    assert read_line("finetune", text) == quiet
    assert read_line("distill", to_line(distill)) == distill
    assert read_line("finetune", to_line(finetune).encode()) == finetune  # bytes, as a file tail reads them
    assert read_line("finetune", to_line(evaluation)) == evaluation
    assert parse_line("distill", distill.to_json()) == distill  # as the database stores it
    assert step_line("finetune", finetune.to_json()) == finetune
    with pytest.raises(DocumentError, match="not an evaluation"):
        step_line("finetune", evaluation.to_json())
    with pytest.raises(ValueError, match="profile writes no telemetry lines"):
        parse_line("profile", distill.to_json())


def test_a_telemetry_line_of_an_earlier_pipebd_is_refused_saying_so() -> None:
    """Lines before documents were versioned: the same keys, no format_version."""
    old = {"time": 1.0, "rank": 0, "epoch": 0, "step": 0, "blocks": [0], "loss": {"0": 1.0}, "done": 1, "total": 8}
    with pytest.raises(DocumentError, match="distill telemetry line was written without a format version"):
        read_line("distill", json.dumps(old))
    with pytest.raises(DocumentError, match="finetune evaluation line was written without a format version"):
        parse_line("finetune", {"time": 1.0, "rank": 0, "epoch": 1, "step": 3, "eval": True, "top1": 0.5})


def test_a_summary_keeps_the_shape_it_was_written_with(tmp_path: Path) -> None:
    """The file is served as it is: only what a phase set, a top-1 of None (no labels) included."""
    run_dir = RunDir(tmp_path)
    run_dir.save_summary(
        Summary(
            name="train-only",
            finetune=FinetuneReport(
                strategy="ddp", top1_before=None, top1_after=None, student=ModelSize(params=1, flops=2.0)
            ),
        )
    )
    written = json.loads(run_dir.summary.read_text())
    assert written == {
        "format_version": 1,
        "name": "train-only",
        "finetune": {
            "strategy": "ddp",
            "top1_before": None,
            "top1_after": None,
            "student": {"params": 1, "flops": 2.0},
        },
    }
    assert run_dir.load_summary().to_json() == written
    run_dir.write_json(run_dir.summary, {"name": "old", "final_loss": {"0": 0.1}})  # before summaries were versioned
    with pytest.raises(DocumentError, match=r"summary\.json was written without a format version"):
        run_dir.load_summary()


def test_a_nas_architecture_json_keeps_its_blocks_alone() -> None:
    nas = Architecture(blocks=[ArchitectureBlock(block=0, layers=["mbconv_k3_e3", "zero"])])
    assert nas.to_json() == {"format_version": 1, "blocks": [{"block": 0, "layers": ["mbconv_k3_e3", "zero"]}]}
    assert Architecture.from_json(nas.to_json()) == nas


def test_plan_json_keeps_its_keys_at_the_top_level() -> None:
    """plan.json's keys are the ones users read (the API, `jq .predicted_step_s`), with format_version added."""
    written = PLAN_SAMPLE.to_json()
    assert {"predicted_step_s", "alternatives", "simulation", "total_steps", "search", "replans"} <= written.keys()
    assert {"details", "predictions", "steps"}.isdisjoint(written)
    assert written["replans"][0]["from"][0]["ranks"] == [0, 1, 2]  # `from`, not the model's from_
    assert "stage" in written["ranks"][0]
    bare = PlanDocument(mode="dp", nproc=2, num_blocks=3, batch_size=8).to_json()
    assert set(bare) == {"format_version", "mode", "nproc", "nodes", "num_blocks", "batch_size", "stages", "routes"} | {
        "assignment",
        "ranks",
        "shapes",
        "block_names",
    }  # a plan without a profile has no prediction keys, and no steps only in the planner's own comparisons


def test_an_unversioned_plan_json_is_refused_saying_so() -> None:
    old = {key: value for key, value in PLAN_SAMPLE.to_json().items() if key != "format_version"}
    with pytest.raises(DocumentError, match=r"plan\.json was written without a format version.*run its spec again"):
        PlanDocument.from_json(old)


def test_a_plan_json_with_an_unknown_key_is_refused_naming_it() -> None:
    with pytest.raises(DocumentError, match="predicted_stepp_s"):
        PlanDocument.from_json({**PLAN_SAMPLE.to_json(), "predicted_stepp_s": 0.1})


def test_finetune_plan_json_keeps_its_keys() -> None:
    written = FINETUNE_SAMPLE.to_json()
    assert {"predicted_step_s", "predicted_stage_s", "simulation", "strategies", "partition", "layer_flops"} <= set(
        written
    )
    assert written["partition"]["stage_work_s"][0] == {"F": 0.002, "delta": 0.001, "G": 0.001, "total": 0.004}
    assert "reason" not in written["strategies"][0] and "step_s" not in written["strategies"][1]


def test_resuming_a_run_directory_with_an_unversioned_plan_json_is_refused_saying_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipebd_core.commands import command_run

    run_dir = RunDir(tmp_path)
    run_dir.write_json(run_dir.spec, tiny_spec().model_dump(mode="json"))
    run_dir.save_phases([PhaseRecord(name="plan", runs="local", state="ended", outcome="succeeded")])
    run_dir.write_json(run_dir.plan, {k: v for k, v in PLAN_SAMPLE.to_json().items() if k != "format_version"})
    assert command_run(argparse.Namespace(resume=str(tmp_path), spec=None, out=None)) != 0
    assert "plan.json was written without a format version" in capsys.readouterr().err
