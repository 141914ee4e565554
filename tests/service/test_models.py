"""The model registry on SQLite and PostgreSQL, from run directories written here as the engine writes them
(no ranks): a teacher trained by one job, a search distilled from it by a second (its spec resolved from
`workload.teacher: {model: N}`) and fine-tuned, a choice made again from that search. Registration records
files with their sha256, parents and figures, once however often it runs; the API lists (filters, pages),
reads and gives the lineage; a spec naming a model is resolved to its files (allowed past the data roots),
an unknown id or a model whose files are gone is a 422 naming `workload.teacher`; a ViT job's distilled_hf/
is the next job's teacher (the preflight builds it) and one the ViT mapping cannot read is refused. The real
chain through workers and Chromium is tests/web/test_models_page.py."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.core.database import get_engine
from app.core.registry import register_job
from app.core.settings import Settings
from app.core.tables import Job, RegisteredModel
from app.services.models import resolve_models
from app.services.specs import validate_document
from pipebd_core.documents.architecture import Architecture, ArchitectureBlock
from pipebd_core.documents.choice import ChoiceRecord
from pipebd_core.documents.summary import FinetuneReport, ModelSize, Summary
from pipebd_core.rundir import RunDir
from pipebd_core.spec import parse_spec
from tests.transformer_specs import TINY_LLAMA, transformer_document, write_text


def text_folder(settings: Settings) -> Path:
    return write_text(settings.roots[0] / "text")


def finished_job(settings: Settings, document: dict[str, Any], run: str) -> tuple[Job, RunDir]:
    """A succeeded job row whose run directory holds spec.json; the run directory to write its outputs in."""
    spec = parse_spec(document)
    run_dir = RunDir(settings.runs / run)
    run_dir.root.mkdir(parents=True)
    run_dir.write_json(run_dir.spec, spec.model_dump(mode="json"))
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        job = Job(name=spec.name, nproc=1, queue="q", spec=spec.model_dump(mode="json"), state="succeeded")
        job.run_dir, job.request_hash = str(run_dir.root), "f" * 64
        session.add(job)
        session.commit()
    return job, run_dir


def report(perplexity: float, params: int) -> FinetuneReport:
    size = ModelSize(params=params, flops=2.0 * params)
    return FinetuneReport(strategy="ddp", top1_before=None, top1_after=None, student=size, perplexity_after=perplexity)


def train_teacher(settings: Settings) -> tuple[Job, RunDir]:
    document = transformer_document(text_folder(settings))
    document["workload"] = {"kind": "train", "config": TINY_LLAMA}
    document["finetune"] = {"strategy": "ddp", "max_steps": 3, "profile": False}
    job, run_dir = finished_job(settings, document, "job-teacher")
    run_dir.teacher_model.mkdir()
    (run_dir.teacher_model / "config.json").write_text(json.dumps(TINY_LLAMA))
    (run_dir.teacher_model / "model.safetensors").write_bytes(b"teacher weights")
    for path in (run_dir.teacher, run_dir.finetuned_model, run_dir.exported_model):
        path.write_bytes(b"trained network")
    run_dir.save_summary(Summary(name="teacher", finetune=report(13.0, 50_000)))
    return job, run_dir


def search_from(settings: Settings, document: dict[str, Any]) -> tuple[Job, RunDir]:
    job, run_dir = finished_job(settings, document, "job-search")
    for path in (run_dir.searched_model, run_dir.distilled_state, run_dir.distilled_export):
        path.write_bytes(b"searched network")
    blocks = [ArchitectureBlock(block=b, layers=["ffn_1/2"], params=100, kv_cache_bytes=32) for b in range(4)]
    run_dir.write_json(run_dir.architecture, Architecture(blocks=blocks, reached={"params": 0.5}).to_json())
    run_dir.save_summary(Summary(name="search", student_perplexity=20.0, finetune=report(15.0, 40_000)))
    run_dir.finetuned_model.write_bytes(b"fine-tuned network")
    return job, run_dir


def choose_written(run_dir: RunDir, index: int) -> None:
    folder = run_dir.choice(index)
    folder.root.mkdir(parents=True)
    folder.searched_model.write_bytes(b"chosen network")
    blocks = [ArchitectureBlock(block=b, layers=["noop"], params=0, kv_cache_bytes=0) for b in range(4)]
    run_dir.write_json(folder.architecture, Architecture(blocks=blocks, reached={"params": 0.0}).to_json())
    record = ChoiceRecord(
        index=index, budget={"params": 0.1}, layers=["noop"] * 4, chosen_by="x", reached={}, perplexity=99.0, seconds=1
    )
    run_dir.write_json(folder.record, record.to_json())


def models_of(settings: Settings) -> list[RegisteredModel]:
    with Session(get_engine(settings.database)) as session:
        return list(session.exec(select(RegisteredModel).order_by(RegisteredModel.id)).all())  # type: ignore[arg-type]


def register(settings: Settings, job: Job) -> list[RegisteredModel]:
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        return register_job(session, job)


def test_a_chain_is_registered_once_and_served_with_its_lineage(client: TestClient, settings: Settings) -> None:
    teacher_job, teacher_dir = train_teacher(settings)
    (teacher,) = register(settings, teacher_job)
    assert (teacher.kind, teacher.parent_id, teacher.parent_hash) == ("teacher", None, None)
    files = {entry["path"]: entry for entry in teacher.files}
    assert set(files) == {
        "teacher_model/config.json",
        "teacher_model/model.safetensors",
        "teacher.pt",
        "finetuned_model.pt",
        "finetuned_model.pt2",
    }
    assert files["teacher.pt"]["sha256"] == hashlib.sha256(b"trained network").hexdigest()
    assert files["teacher.pt"]["size"] == len(b"trained network")
    assert teacher.metrics == {"perplexity": 13.0, "params": 50_000, "flops": 100_000.0}
    assert teacher.spec_hash == "f" * 64 and teacher.data_fingerprint is not None

    # the second job's spec names the teacher as a registered model: resolved to its directory, past the roots
    document = transformer_document(text_folder(settings))  # its random teacher's config kept: the model replaces it
    document["workload"].update({"teacher": {"model": teacher.id}, "replacements": ["keep", "ffn_1/2", "noop"]})
    document["finetune"] = {"strategy": "ddp", "max_steps": 3, "profile": False}
    with Session(get_engine(settings.database)) as session:
        resolved, allowed = resolve_models(session, document)
    assert resolved["workload"]["teacher"] == str(teacher_dir.teacher_model) and allowed == [teacher_dir.teacher_model]
    assert "config" not in resolved["workload"]
    validate_document(resolved, settings, allowed)
    elsewhere = settings.data_dir.parent / "elsewhere"  # outside the data roots and this server's runs folder
    plain = {**resolved, "workload": {**resolved["workload"], "teacher": str(elsewhere)}}
    with pytest.raises(Exception, match="outside the data roots"):  # only the resolved path is allowed
        validate_document(plain, settings, allowed)

    search_job, search_dir = search_from(settings, resolved)
    searched, tuned = register(settings, search_job)
    assert (searched.kind, searched.parent_id, searched.parent_hash) == ("searched", teacher.id, teacher.content_hash)
    assert searched.metrics == {
        "perplexity": 20.0,
        "params": 40_000,
        "flops": 80_000.0,
        "layer_params": 400,
        "kv_cache_bytes_per_token": 128,
        "reached": {"params": 0.5},
    }
    assert (tuned.kind, tuned.parent_id, tuned.metrics["perplexity"]) == ("finetuned", searched.id, 15.0)
    choose_written(search_dir, 1)
    names = [model.name for model in register(settings, search_job)]  # again, with a choice made since
    assert names == ["searched", "finetuned", "choice-1"]
    assert [model.name for model in register(settings, teacher_job)] == ["teacher"]
    stored = models_of(settings)
    assert [(model.kind, model.parent_id) for model in stored] == [
        ("teacher", None),
        ("searched", teacher.id),
        ("finetuned", searched.id),
        ("chosen", searched.id),
    ]

    lineage = client.get(f"/api/v1/models/{tuned.id}/lineage")
    assert lineage.status_code == 200, lineage.text
    assert [item["kind"] for item in lineage.json()["chain"]] == ["teacher", "searched", "finetuned"]
    below = client.get(f"/api/v1/models/{teacher.id}/lineage").json()["descendants"]
    assert [(item["kind"], item["parent_id"]) for item in below] == [
        ("searched", teacher.id),
        ("finetuned", searched.id),
        ("chosen", searched.id),
    ]
    chosen = client.get(f"/api/v1/models/{stored[-1].id}").json()
    assert chosen["architecture"]["blocks"][0]["layers"] == ["noop"] and chosen["metrics"]["perplexity"] == 99.0
    detail = client.get(f"/api/v1/models/{searched.id}").json()
    urls = {entry["path"]: entry["url"] for entry in detail["files"]}
    assert urls["searched_model.pt"] == f"/api/v1/jobs/{search_job.id}/artifacts/searched_model.pt"
    assert detail["files_present"] is True and detail["architecture"]["reached"] == {"params": 0.5}
    page = client.get("/api/v1/models", params={"limit": 2}).json()
    assert [item["id"] for item in page["data"]] == [stored[3].id, stored[2].id]
    rest = client.get("/api/v1/models", params={"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [item["id"] for item in rest["data"]] == [stored[1].id, stored[0].id] and rest["next_cursor"] is None
    by_parent = client.get("/api/v1/models", params={"parent_id": searched.id, "kind": "chosen"}).json()["data"]
    assert [item["name"] for item in by_parent] == ["choice-1"]
    assert [m["kind"] for m in client.get("/api/v1/models", params={"job_id": teacher_job.id}).json()["data"]] == [
        "teacher"
    ]
    assert client.get("/api/v1/models", params={"kind": "nope"}).status_code == 422
    missing = client.get("/api/v1/models/999999")
    assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"
    assert "999999" in missing.json()["detail"]

    # pages: the list, the model with its chain and figures beside its parent's, the editor filled in
    listing = client.get("/models").text
    assert f'id="model-{tuned.id}"' in listing
    row = listing[listing.index(f'id="model-{teacher.id}"') :].split("</tr>")[0]  # a teacher: both links
    assert 'class="compress-further" href="/jobs/new?spec=' in row and 'class="fine-tune" href="/jobs/new?spec=' in row
    assert f"model%3A+{teacher.id}" in row  # the spec names it: workload.teacher {model: N}
    row = listing[listing.index(f'id="model-{searched.id}"') :].split("</tr>")[0]
    assert "compress-further" not in row  # no Hugging Face directory: it cannot be a teacher
    html = client.get(f"/models/{searched.id}").text
    assert 'data-kind="teacher"' in html and "20.00" in html and "13.00" in html
    assert 'id="compress-further"' not in html  # no Hugging Face directory yet: it cannot be a teacher
    html = client.get(f"/models/{teacher.id}").text
    assert 'id="compress-further"' in html and 'id="fine-tune"' in html
    assert client.get("/models/999999").status_code == 404


def test_a_spec_naming_an_unknown_or_lost_model_is_refused_naming_the_field(
    client: TestClient, settings: Settings
) -> None:
    teacher_job, teacher_dir = train_teacher(settings)
    (teacher,) = register(settings, teacher_job)
    document = transformer_document(text_folder(settings))
    del document["workload"]["config"]
    for reference, words in (({"model": 424242}, "registered model 424242 does not exist"), ({"id": 1}, "{model: N}")):
        document["workload"]["teacher"] = reference
        answer = client.post("/api/v1/jobs", json=document)
        assert answer.status_code == 422, answer.text
        (problem,) = answer.json()["errors"]
        assert problem["loc"] == ["body", "workload", "teacher"] and words in problem["message"]
    (teacher_dir.teacher_model / "model.safetensors").unlink()
    document["workload"]["teacher"] = {"model": teacher.id}
    answer = client.post("/api/v1/jobs", json=document)
    assert answer.status_code == 422
    (problem,) = answer.json()["errors"]
    assert problem["loc"] == ["body", "workload", "teacher"]
    assert f"registered model {teacher.id}" in problem["message"] and "model.safetensors" in problem["message"]
    assert client.get(f"/api/v1/models/{teacher.id}").json()["files_present"] is False


def test_a_sweep_names_a_registered_model_as_a_job_does(client: TestClient, settings: Settings) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    teacher_job, teacher_dir = train_teacher(settings)
    config = AutoConfig.for_model(**TINY_LLAMA)  # weights the preflight loads: the tiny teacher itself
    AutoModelForCausalLM.from_config(config).save_pretrained(str(teacher_dir.teacher_model))
    (teacher,) = register(settings, teacher_job)
    document = transformer_document(text_folder(settings))
    del document["workload"]["config"]
    document["workload"]["teacher"] = {"model": teacher.id}
    answer = client.post("/api/v1/sweeps", json={"spec": document, "grid": {"train.lr": [0.01, 0.05]}})
    assert answer.status_code == 202, answer.text
    with Session(get_engine(settings.database)) as session:
        children = session.exec(select(Job).where(Job.sweep_id == answer.json()["id"])).all()
    assert [child.spec["train"]["lr"] for child in children] == [0.01, 0.05]
    assert {child.spec["workload"]["teacher"] for child in children} == {str(teacher_dir.teacher_model)}
    grid = {"workload.teacher": [{"model": teacher.id}, {"model": 424242}]}  # a child's override names it
    answer = client.post("/api/v1/sweeps", json={"spec": document, "grid": grid})
    assert answer.status_code == 422, answer.text
    (problem,) = answer.json()["errors"]
    assert problem["loc"] == ["body", "grid", "workload.teacher"] and "child 1" in problem["message"]
    assert "registered model 424242 does not exist" in problem["message"]


def test_a_network_of_pipebds_own_layers_is_a_teacher_where_its_version_is_read_back(
    client: TestClient, settings: Settings
) -> None:
    document = transformer_document(text_folder(settings), workload={"replacements": ["keep", "noop"]})
    search_job, run_dir = search_from(settings, document)
    run_dir.searched_hf.mkdir()  # a search's mixed layers: PipeBD's own modeling code (auto_map)
    config = {
        "model_type": "pipebd",
        "auto_map": {
            "AutoConfig": "configuration_pipebd.PipeBDConfig",
            "AutoModelForCausalLM": "modeling_pipebd.PipeBDForCausalLM",
        },
        "pipebd_version": "2",
        "block_configs": [{"kind": "noop"}],
    }
    (run_dir.searched_hf / "config.json").write_text(json.dumps(config))
    (run_dir.searched_hf / "model.safetensors").write_bytes(b"searched weights")
    searched = {model.kind: model for model in register(settings, search_job)}["searched"]
    assert any(entry["path"] == "searched_hf/config.json" for entry in searched.files)
    next_job = transformer_document(text_folder(settings), workload={"replacements": ["keep"]})
    del next_job["workload"]["config"]
    next_job["workload"]["teacher"] = {"model": searched.id}
    with Session(get_engine(settings.database)) as session:  # what the job gets (its run is tests/ranks')
        resolved, allowed = resolve_models(session, next_job)
    assert resolved["workload"]["teacher"] == str(run_dir.searched_hf) and allowed == [run_dir.searched_hf]
    assert 'id="compress-further"' in client.get(f"/models/{searched.id}").text
    (run_dir.searched_hf / "config.json").write_text(json.dumps({**config, "pipebd_version": "9"}))
    answer = client.post("/api/v1/jobs", json=next_job)
    assert answer.status_code == 422, answer.text
    (problem,) = answer.json()["errors"]
    assert problem["loc"] == ["body", "workload", "teacher"] and "model_type pipebd" in problem["message"]
    assert "version '9'" in problem["message"] and "reads versions 1, 2" in problem["message"]  # found, supported
    assert 'id="compress-further"' not in client.get(f"/models/{searched.id}").text
    listing = client.get("/models").text
    assert "compress-further" not in listing[listing.index(f'id="model-{searched.id}"') :].split("</tr>")[0]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)  # the registry's SQL is the tests' above
def test_a_distilled_vit_directory_is_the_next_jobs_teacher(client: TestClient, settings: Settings) -> None:
    from pipebd_core.workloads.transformer import rebuild
    from pipebd_core.workloads.vit_directory import write_vit_directory
    from tests.transformer_specs import TINY_VIT, vit_document

    document = vit_document()
    job, run_dir = finished_job(settings, document, "job-vit")
    spec = parse_spec(document)
    assert write_vit_directory(spec, rebuild(spec), ["ffn_1/2"] * TINY_VIT["num_layers"], run_dir.distilled_hf)
    distilled = {model.kind: model for model in register(settings, job)}["distilled"]
    page = client.get(f"/models/{distilled.id}").text
    assert 'id="compress-further"' in page and 'id="fine-tune"' in page
    next_job = vit_document(workload={"config": None, "teacher": {"model": distilled.id}, "replacements": ["keep"]})
    answer = client.post("/api/v1/jobs", json=next_job)  # the preflight builds the workload from the directory
    assert answer.status_code == 202, answer.text
    assert answer.json()["spec"]["workload"]["teacher"] == str(run_dir.distilled_hf)
    config = json.loads((run_dir.distilled_hf / "config.json").read_text())
    (run_dir.distilled_hf / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    answer = client.post("/api/v1/jobs", json=next_job)
    assert answer.status_code == 422, answer.text
    (problem,) = answer.json()["errors"]
    assert "hidden_act 'relu' is not supported; the encoder layers use 'gelu'" in problem["message"]
