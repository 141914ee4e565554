"""Service tier: the bundled examples not run elsewhere run to success as shipped (their step counts shrunk),
through the service.

examples/tiny-vit-teacher.yaml, then examples/tiny-vit-digits.yaml distilling the teacher that job wrote,
named as the registered model it became (`--set 'workload.teacher={model: N}'`, no file copied: the model's
`teacher_model/`, a ViTForImageClassification directory, replaces the example's random-teacher `config` and
its `teacher_weights`), 4 steps a phase; and examples/tiny-llama-search.yaml with its random teacher, 2 steps.
Each file is submitted as `pipebd submit` posts it, nothing overridden but those step counts, on the session's
`embedded` service (a real worker with a default server's data roots). The teacher's directory is also checked
against the job's own teacher: `ViTForImageClassification.from_pretrained` gives teacher.pt's logits. The
language-model chain (tiny-llama-teacher.yaml, then tiny-llama-text.yaml) runs in tests/service/test_phases.py.

A worker's own process never builds a network or loads a data set: every phase that does (the launch's
preflight, plan, plan_finetune, and the ranks' phases) runs in a child process, so the long-lived worker
imports none of torch, torchvision and transformers, however many jobs it runs. The embedded worker that ran the
ViT chain (a torchvision ViT trained, then searched with transformers' layers and fine-tuned: every phase)
is asked what it imported (tests/service/heavy_imports.py), and so is a process that plans the same jobs
itself.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import ROOT
from tests.service.conftest import Embedded
from tests.service.heavy_imports import imported_planning_here
from tests.service.test_phases import submit, submitted_example

# Only the step counts are shrunk, as the language-model chain's are: every phase still runs, and the shipped
# 450 teacher steps and 100 + 135 distillation steps took 72-121 s of a suite's time to prove nothing more.
SHRUNK = {"teacher": ["finetune.max_steps=4"], "distil": ["train.max_steps=4", "finetune.max_steps=4"]}


def registered(embedded: Embedded, job_id: int) -> dict[str, dict[str, Any]]:
    """The job's registered models by kind."""
    models = embedded.client.get("/api/v1/models", params={"job_id": job_id}).json()["data"]
    return {model["kind"]: model for model in models}


def test_the_vit_teacher_then_its_distillation_run_as_shipped_chained_by_the_registry(
    embedded: Embedded, tmp_path: Path
) -> None:
    from transformers import ViTForImageClassification

    from pipebd_core.spec import parse_spec
    from pipebd_core.workloads.vision_transformer import build_vit

    trained = submit(embedded, submitted_example("tiny-vit-teacher.yaml", *SHRUNK["teacher"]))
    run = embedded.job_dir(trained["id"])
    own = build_vit(parse_spec(trained["spec"]))
    own.load_state_dict(torch.load(run / "teacher.pt", weights_only=True))
    directory = ViTForImageClassification.from_pretrained(str(run / "teacher_model"), local_files_only=True)
    images = torch.randn(8, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(directory.eval()(pixel_values=images).logits, own.eval()(images))
    teacher = registered(embedded, trained["id"])["teacher"]
    assert "teacher_model/config.json" in {entry["path"] for entry in teacher["files"]}
    listed = {item["name"] for item in embedded.client.get(f"/api/v1/jobs/{trained['id']}/artifacts").json()["data"]}
    assert {"teacher_model.tar", "teacher.pt"} <= listed

    distilled = submit(
        embedded,
        submitted_example("tiny-vit-digits.yaml", f"workload.teacher={{model: {teacher['id']}}}", *SHRUNK["distil"]),
    )
    workload = distilled["spec"]["workload"]
    assert workload["teacher"] == str(run / "teacher_model") and workload.get("config") is None
    assert [p["name"] for p in distilled["phases"]] == [
        "plan",
        "distill",
        "finalize",
        "plan_finetune",
        "finetune",
        "evaluate",
    ]
    tuned = json.loads((embedded.job_dir(distilled["id"]) / "summary.json").read_text())["finetune"]
    assert tuned["teacher_top1"] == json.loads((run / "summary.json").read_text())["finetune"]["top1_after"]
    models = registered(embedded, distilled["id"])
    assert models["searched"]["parent_id"] == teacher["id"]  # the chain through the registry
    assert models["finetuned"]["parent_id"] == models["searched"]["id"]

    # the worker that ran both jobs end to end built no network in its own process; planning them in a
    # process, as PipeBD did before, is what the check exists to catch (on copies: the jobs' folders stay)
    assert embedded.worker_imported() == []
    copies = [
        shutil.copytree(embedded.job_dir(job["id"]), tmp_path / f"job-{job['id']}") for job in (trained, distilled)
    ]
    assert imported_planning_here(tmp_path / "planner-imports", *copies) == ["torch", "torchvision", "transformers"]


def test_the_llama_search_runs_as_shipped(embedded: Embedded, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # as `make run` runs: the example's `data.root: docs` is the checkout's
    job = submit(embedded, submitted_example("tiny-llama-search.yaml", "train.max_steps=2"))  # not 100
    run = embedded.job_dir(job["id"])
    architecture = json.loads((run / "architecture.json").read_text())
    assert len(architecture["candidates"]) == 4 * 7  # the library kept: every layer's seven candidates
    assert architecture["reached"]["params"] <= 0.5 and (run / "searched_hf" / "config.json").is_file()
    assert registered(embedded, job["id"])["searched"]["metrics"]["reached"] == architecture["reached"]
