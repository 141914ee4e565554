"""Service tier: a job is a sequence of phases under one supervisor, whoever runs it.

The same spec through `pipebd run` and through the service writes the same events; a succeeded job's
phases are in order, back to back, each with an outcome, and a cached profile shows as skipped; every
documented output of the run directory (NAS and compression ones included) is listed and downloads
byte for byte; the bundled language-model examples run to success as shipped (step counts shrunk), the
second distilling the teacher the first wrote, which is end-to-end training and a teacher directory
(tests/ranks/test_finetune_transformer.py's `assert_trained_here_and_a_teacher`). Jobs run on the session's
`embedded` service (a real worker on SQLite, with a default server's data roots).
"""

from __future__ import annotations

import argparse
import itertools
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pipebd_core.rundir import RunDir
from tests.helpers import ROOT, pipebd, tiny_document, write_spec
from tests.ranks.test_finetune_transformer import assert_trained_here_and_a_teacher
from tests.ranks.test_nas import nas_document
from tests.service.conftest import Embedded
from tests.service.downloads import assert_outputs_download

JOB_TIMEOUT_S = 240


def submit(embedded: Embedded, document: dict[str, Any]) -> dict[str, Any]:
    response = embedded.client.post("/api/v1/jobs", json=document)
    assert response.status_code == 202, response.text
    job = embedded.wait_state(response.json()["id"], {"succeeded", "failed", "cancelled"}, JOB_TIMEOUT_S)
    assert job["state"] == "succeeded", embedded.client.get(f"/api/v1/jobs/{job['id']}").json()["error"]
    detail: dict[str, Any] = embedded.client.get(f"/api/v1/jobs/{job['id']}").json()
    return detail


def event_kinds(run: Path) -> list[str]:
    return [json.loads(line)["event"] for line in (run / "events.jsonl").read_text().splitlines()]


def test_pipebd_run_and_the_service_write_the_same_events(embedded: Embedded, tmp_path: Path) -> None:
    document = tiny_document(schedule={"nproc": 1, "profile": False}, train={"epochs": 1})
    result = pipebd("run", str(write_spec(tmp_path, document)), "--out", str(tmp_path / "cli"))
    assert result.returncode == 0, result.stderr
    job = submit(embedded, document)
    assert job["samples_per_s"] > 0  # a finished job keeps its distillation's throughput on its row
    by_cli, by_service = event_kinds(tmp_path / "cli"), event_kinds(embedded.job_dir(job["id"]))
    assert by_cli == by_service
    assert by_cli[0] == "prepared" and by_cli[-1] == "finished"
    phases = [json.loads(line) for line in (tmp_path / "cli" / "events.jsonl").read_text().splitlines()]
    started = [event["phase"] for event in phases if event["event"] == "phase_started"]
    assert started == ["plan", "distill", "finalize"]


def assert_back_to_back(phases: list[dict[str, Any]]) -> None:
    """In order, each with an outcome, each starting when the one before it ended (within a second)."""

    def at(stamp: str) -> float:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()

    assert all(phase["state"] == "ended" and phase["outcome"] for phase in phases), phases
    for before, after in itertools.pairwise(phases):
        gap = at(after["started_at"]) - at(before["ended_at"])
        assert 0 <= gap < 1.0, (before["name"], after["name"], gap)
    assert all(at(phase["ended_at"]) >= at(phase["started_at"]) for phase in phases)


def test_phases_are_in_order_back_to_back_and_a_cached_profile_is_skipped(embedded: Embedded) -> None:
    document = {**tiny_document(schedule={"nproc": 1, "profile": True}, train={"epochs": 1}), "name": "profiled"}
    measured = submit(embedded, document)
    assert [(p["name"], p["outcome"]) for p in measured["phases"]] == [
        ("profile", "succeeded"),
        ("plan", "succeeded"),
        ("distill", "succeeded"),
        ("finalize", "succeeded"),
    ]
    assert_back_to_back(measured["phases"])
    assert measured["phase"] == "finalize" and measured["progress"] == 1.0
    cached = submit(embedded, document)  # the same workload on the same node: the profile is in the cache
    profile = cached["phases"][0]
    assert profile["name"] == "profile" and profile["outcome"] == "skipped"
    assert profile["reason"].startswith("cached profile profiled-")
    assert_back_to_back(cached["phases"])
    run = embedded.job_dir(cached["id"])
    assert json.loads((run / "profile.json").read_text()) == json.loads(
        (embedded.job_dir(measured["id"]) / "profile.json").read_text()
    )
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    skipped = [e for e in events if e["event"] == "phase_finished" and e["phase"] == "profile"]
    assert skipped[0]["outcome"] == "skipped" and not any(
        e["event"] == "launched" and e["phase"] == "profile" for e in events
    )


def test_a_nas_job_s_outputs_are_listed_downloadable_and_linked(embedded: Embedded) -> None:
    job = submit(embedded, nas_document(train={"epochs": 1}))
    nas_outputs = {"architecture.json", "searched_model.pt", "student.pt", "summary.json", "phases.json"}
    assert_outputs_download(
        embedded.client,
        embedded.job_dir(job["id"]),
        job["id"],
        nas_outputs | {"plan.json", "spec.json", "events.jsonl"},
    )
    page = embedded.client.get(f"/jobs/{job['id']}").text
    for name in ("architecture.json", "searched_model.pt"):
        assert f'href="/api/v1/jobs/{job["id"]}/artifacts/{name}"' in page


def test_a_compression_job_s_compressed_model_downloads(embedded: Embedded) -> None:
    document = {
        "name": "small-vgg",
        "workload": {"kind": "compression", "teacher": "vgg11", "granularity": "stage"},
        "data": {"dataset": "synthetic", "image_size": 32, "num_samples": 8, "batch_size": 4, "eval_samples": 0},
        "train": {"epochs": 1, "max_steps": 1},
        "schedule": {"mode": "tr_dpu", "nproc": 1, "profile": False},
    }
    job = submit(embedded, document)
    assert_outputs_download(
        embedded.client, embedded.job_dir(job["id"]), job["id"], {"compressed_model.pt", "student.pt", "summary.json"}
    )


def test_a_finetune_job_streams_its_telemetry_and_evaluations_and_offers_its_outputs(embedded: Embedded) -> None:
    from tests.ranks.test_finetune import e2e_document

    job = submit(embedded, e2e_document("gpipe", 2))
    assert [p["name"] for p in job["phases"]] == ["plan_finetune", "finetune", "evaluate"]
    run = embedded.job_dir(job["id"])
    lines = [
        line
        for rank in (0, 1)
        for line in (run / "metrics" / "finetune" / f"rank-{rank}.jsonl").read_text().splitlines()
    ]
    body = embedded.client.get(f"/api/v1/jobs/{job['id']}/metrics", params={"phase": "finetune"}).json()
    steps = [line for line in lines if '"eval"' not in line]
    assert body["total"] == len(steps) == 6  # 3 steps on each of the 2 stages, every one stored once
    assert [e["epoch"] for e in body["evals"]] == [1] and 0 <= body["evals"][0]["top1"] <= 1
    outputs = {"finetuned_model.pt", "finetuned_model.pt2", "teacher.pt", "finetune_plan.json", "summary.json"}
    assert_outputs_download(embedded.client, embedded.job_dir(job["id"]), job["id"], outputs)
    summary = json.loads((run / "summary.json").read_text())["finetune"]
    assert summary["strategy"] == "gpipe" and set(summary["phase_s"]) == {"plan_finetune", "finetune", "evaluate"}


def submitted_example(name: str, *overrides: str) -> dict[str, Any]:
    """What `pipebd submit examples/NAME --set OVERRIDE...` posts: the bundled file as shipped, overridden."""
    from app.cli.remote import spec_document

    return dict(
        spec_document(argparse.Namespace(spec=ROOT / "examples" / name, set=list(overrides), nproc=None, mode=None))
    )


def test_the_bundled_language_model_examples_run_chained_through_the_service_and_download(
    embedded: Embedded, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/tiny-llama-teacher.yaml, then examples/tiny-llama-text.yaml naming the teacher that job wrote
    (as the examples' comments say), through the API and a worker with the default data roots; only their step
    counts are shrunk. The teacher downloads as a model folder, the distillation's outputs byte for byte."""
    import io
    import tarfile

    monkeypatch.chdir(ROOT)  # as `make run` runs: the examples' `data.root: docs` is the checkout's
    job = submit(embedded, submitted_example("tiny-llama-teacher.yaml", "finetune.max_steps=2"))
    model = embedded.job_dir(job["id"]) / "teacher_model"
    files = {p.relative_to(model.parent).as_posix(): p.read_bytes() for p in model.rglob("*") if p.is_file()}
    assert {"teacher_model/config.json", "teacher_model/model.safetensors"} <= set(files)
    listed = {item["name"]: item for item in embedded.client.get(f"/api/v1/jobs/{job['id']}/artifacts").json()["data"]}
    archive = embedded.client.get(listed["teacher_model.tar"]["url"])
    assert archive.status_code == 200 and len(archive.content) == listed["teacher_model.tar"]["size"]
    with tarfile.open(fileobj=io.BytesIO(archive.content)) as tar:
        got = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert got == files
    page = embedded.client.get(f"/jobs/{job['id']}").text
    assert f'href="/api/v1/jobs/{job["id"]}/artifacts/teacher_model.tar"' in page
    assert_trained_here_and_a_teacher(RunDir(model.parent))  # end-to-end training, a teacher, the data's tokenizer
    # the next job names it where this server wrote it: the runs folder counts as inside the data roots
    teacher = ("workload.teacher=" + str(model), "workload.config=null")
    distilled = submit(embedded, submitted_example("tiny-llama-text.yaml", *teacher, "train.max_steps=2"))
    assert distilled["spec"]["workload"]["teacher"] == str(model) and distilled["spec"]["data"]["root"] == "docs"
    outputs = {"student.pt", "distilled_state.pt", "summary.json", "plan.json", "spec.json", "events.jsonl"}
    assert_outputs_download(embedded.client, embedded.job_dir(distilled["id"]), distilled["id"], outputs)
