"""The model registry end to end, against the real service (`pipebd up`: API, worker, torchrun ranks on the
CPU) and Chromium: a tiny Llama teacher trained by one job; a budgeted search distilled from it by a second
job of 2 ranks that names it as `workload.teacher: {model: N}`, fine-tuned with KD in the same job and followed
on its job page while it runs (each layer's choice, the budget, the perplexities); the chain teacher -> searched
-> fine-tuned through the lineage endpoint and on the /models pages; the search chosen again for another budget
(201, its architecture, a registered model whose parent is the search); a missing id is a 422 naming the
field, a budget on a cost the search did not measure the engine's 422.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
import yaml

from app.cli.main import main as pipebd
from tests.transformer_specs import TINY_LLAMA, transformer_document, write_text
from tests.web.browser import DESKTOP, PHONE, pipebd_up, watched_page
from tests.web.test_browser import api_job, wait_until_ready

pytestmark = pytest.mark.timeout(600)
JOB_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("registry")


@pytest.fixture(scope="module")
def service(folder: Path) -> Iterator[str]:
    with pipebd_up(folder) as url:
        yield url


def finished(service: str, document: dict[str, Any]) -> int:
    created = httpx.post(f"{service}/api/v1/jobs", json=document, timeout=120)
    assert created.status_code == 202, created.text
    job_id: int = created.json()["id"]
    finished_job(service, job_id)
    return job_id


def finished_job(service: str, job_id: int) -> None:
    """Wait until the job ends; it must have succeeded."""
    deadline = time.time() + JOB_TIMEOUT_S
    while time.time() < deadline:
        job = httpx.get(f"{service}/api/v1/jobs/{job_id}", timeout=30).json()
        if job["state"] in ("succeeded", "failed", "cancelled"):
            assert job["state"] == "succeeded", job["error"]
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} did not finish within {JOB_TIMEOUT_S} s")


def models(service: str, **query: Any) -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = httpx.get(f"{service}/api/v1/models", params=query, timeout=30).json()["data"]
    return data


@pytest.fixture(scope="module")
def teacher(service: str, folder: Path) -> dict[str, Any]:
    """The teacher job, trained here, and its registered model."""
    text = write_text(folder / "data" / "datasets" / "text")  # inside the server's data roots
    teacher_doc = transformer_document(text)
    teacher_doc["name"] = "registry-teacher"
    teacher_doc["workload"] = {"kind": "train", "config": TINY_LLAMA}
    teacher_doc["finetune"] = {"strategy": "ddp", "max_steps": 3, "lr": 0.3, "profile": False}
    teacher_job = finished(service, teacher_doc)
    (model,) = models(service, job_id=teacher_job)
    return {"teacher_job": teacher_job, "teacher": model}


@pytest.fixture(scope="module")
def search_job(service: str, folder: Path, teacher: dict[str, Any]) -> int:
    """The budgeted search of 2 ranks distilled from the registered teacher and fine-tuned with KD, submitted
    and not waited for: the first test follows it on its page (the search page test, which once ran a search
    of its own from a random teacher in test_browser.py)."""
    search_doc = transformer_document(folder / "data" / "datasets" / "text", schedule={"nproc": 2})
    search_doc["name"] = "llama-search"
    del search_doc["workload"]["config"]
    search_doc["workload"].update(
        {"teacher": {"model": teacher["teacher"]["id"]}, "replacements": ["keep", "ffn_1/2", "noop"]}
    )
    search_doc["workload"]["budget"] = {"params": 0.6}
    search_doc["finetune"] = {"strategy": "ddp", "loss": "kd", "max_steps": 3, "lr": 0.05, "profile": False}
    created = httpx.post(f"{service}/api/v1/jobs", json=search_doc, timeout=120)
    assert created.status_code == 202, created.text
    job_id: int = created.json()["id"]
    return job_id


@pytest.fixture(scope="module")
def chain(service: str, teacher: dict[str, Any], search_job: int) -> dict[str, Any]:
    """The teacher job, the search job and their registered models, once for the module."""
    finished_job(service, search_job)
    registered = {model["kind"]: model for model in models(service, job_id=search_job)}
    return {**teacher, "search_job": search_job, **registered}


def test_a_transformer_search_page_shows_each_layers_choice_the_budget_and_perplexity_distilled_and_finetuned(
    browser: Any, service: str, search_job: int
) -> None:
    job_id = search_job  # submitted just now: the page below follows it from the start
    with watched_page(browser, service) as watched:
        page = watched.page
        page.goto(f"/jobs/{job_id}")
        wait_until_ready(watched)
        page.wait_for_selector("body[data-stream-ended='1']", timeout=JOB_TIMEOUT_S * 1000)
        assert api_job(service, job_id)["state"] == "succeeded"
        page.wait_for_selector("#part-outcome #outcome-layers")  # shown without a reload once finalize ran
        assert page.evaluate("window.__sameDocument") is True
        architecture = httpx.get(f"{service}/api/v1/jobs/{job_id}/artifacts/architecture.json", timeout=30).json()
        chosen = [block["layers"][0] for block in architecture["blocks"]]
        rows = page.locator("#outcome-layers tbody tr")
        assert [row.get_attribute("data-chosen") for row in rows.all()] == chosen
        assert page.locator("#outcome-layers td.chosen").count() == 4
        # the library's trade-off curve per cost, the search's own choice marked on each (app/web/tradeoff_chart.py)
        assert page.locator("#tradeoff-params circle[data-choice='the search']").count() == 1
        assert page.locator("#tradeoff-kv_cache path.best-line").count() == 1
        assert page.locator("#tradeoff-choices tbody tr").count() == 1
        assert page.locator("#outcome-layers thead th.mono").all_inner_texts() == ["keep", "ffn_1/2", "noop"]
        reached = architecture["reached"]["params"]
        assert page.locator("#outcome-reached-params").inner_text() == f"{100 * reached:.1f}%" and reached <= 0.6
        assert "params at most 60.0% of the teacher's layers" in page.locator("#outcome-budget").inner_text()
        summary = httpx.get(f"{service}/api/v1/jobs/{job_id}/artifacts/summary.json", timeout=30).json()
        distilled, teacher = summary["student_perplexity"], summary["teacher_perplexity"]
        assert f"distilled {distilled:.2f}, teacher {teacher:.2f}" in page.locator("#outcome-perplexity").inner_text()
        assert page.locator("#artifact-list a", has_text="searched_model.pt").count() == 1
        tuned = summary["finetune"]  # the fine-tuned language model: perplexity, charted and reported
        assert page.locator("#chart-ft-acc .u-legend", has_text="eval perplexity").count() == 1
        assert page.locator("#chart-ft-acc .u-legend", has_text="top-1").count() == 0
        assert page.locator("#chart-ft-acc .u-legend", has_text="train batch").count() == 0
        assert int(page.locator("#chart-ft-acc").get_attribute("data-points") or 0) >= 1
        assert page.locator("#finetune-perplexity").inner_text() == f"{tuned['perplexity_after']:.2f}"
        assert "perplexity" in page.locator("#chart-ft-acc figcaption").inner_text()
        watched.screenshot("job-transformer-search-1280")
        page.set_viewport_size(PHONE)
        page.wait_for_timeout(300)
        assert watched.overflow() == 0
        watched.screenshot("job-transformer-search-390")
        page.set_viewport_size(DESKTOP)
        page.goto("/compare?name=llama-search")  # the paged comparison's perplexity column: the fine-tuned one
        cell = page.locator(f'tr[data-job="{job_id}"] td.perplexity')
        assert cell.inner_text() == f"{tuned['perplexity_after']:.2f}" != f"{distilled:.2f}"
        assert watched.errors == []


def test_a_teacher_compressed_from_its_registered_model_and_fine_tuned_is_one_chain(
    service: str, chain: dict[str, Any], browser: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    teacher, searched, tuned = chain["teacher"], chain["searched"], chain["finetuned"]
    assert teacher["kind"] == "teacher" and teacher["parent_id"] is None
    assert {entry["path"] for entry in teacher["files"]} >= {"teacher_model/config.json", "teacher.pt"}
    assert searched["parent_id"] == teacher["id"] and searched["parent_hash"] == teacher["content_hash"]
    assert tuned["parent_id"] == searched["id"]
    assert searched["metrics"]["perplexity"] > 1 and tuned["metrics"]["perplexity"] > 1
    assert searched["metrics"]["reached"]["params"] <= 0.6
    lineage = httpx.get(f"{service}/api/v1/models/{tuned['id']}/lineage", timeout=30).json()
    assert [(item["id"], item["kind"]) for item in lineage["chain"]] == [
        (teacher["id"], "teacher"),
        (searched["id"], "searched"),
        (tuned["id"], "finetuned"),
    ]
    spec = httpx.get(f"{service}/api/v1/jobs/{chain['search_job']}", timeout=30).json()["spec"]
    assert spec["workload"]["teacher"].endswith(f"job-{chain['teacher_job']}/teacher_model")

    assert pipebd(["models", "--server", service]) == 0
    listed = capsys.readouterr().out
    assert all(f" {kind} " in listed for kind in ("teacher", "searched", "finetuned"))
    assert pipebd(["models", str(tuned["id"]), "--server", service]) == 0
    shown = f"#{teacher['id']} teacher -> #{searched['id']} searched -> #{tuned['id']} finetuned"
    assert shown in capsys.readouterr().out

    with watched_page(browser, service) as watched:
        page = watched.page
        page.goto("/models")
        assert page.locator(f"#model-{tuned['id']}[data-parent='{searched['id']}']").count() == 1
        page.click(f"#model-{tuned['id']} a[href='/models/{tuned['id']}']")
        page.wait_for_selector("#model-chain")
        kinds = [item.get_attribute("data-kind") for item in page.locator("#model-chain li").all()]
        assert kinds == ["teacher", "searched", "finetuned"]
        row = page.locator("#model-figures tr[data-figure='perplexity']")
        assert row.locator("td.mine").inner_text() == f"{tuned['metrics']['perplexity']:.2f}"
        assert row.locator("td.parent").inner_text() == f"{searched['metrics']['perplexity']:.2f}"
        watched.screenshot("model-finetuned-1280")
        page.goto(f"/models/{teacher['id']}")
        assert page.locator("#model-descendants li").count() >= 2
        page.click("#compress-further")
        page.wait_for_selector("#spec")
        filled = yaml.safe_load(page.locator("#spec").input_value())
        assert filled["workload"]["teacher"] == {"model": teacher["id"]}
        query = parse_qs(urlsplit(page.url).query)
        assert "spec" in query
        assert watched.errors == []


def test_a_model_id_that_does_not_exist_is_refused_naming_the_field(service: str, chain: dict[str, Any]) -> None:
    document = transformer_document(Path("/nowhere"))
    del document["workload"]["config"]
    document["workload"]["teacher"] = {"model": 99999}
    answer = httpx.post(f"{service}/api/v1/jobs", json=document, timeout=60)
    assert answer.status_code == 422
    assert [problem["loc"] for problem in answer.json()["errors"]] == [["body", "workload", "teacher"]]


def test_choosing_again_registers_the_new_network_under_the_search(
    service: str, chain: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    path = f"{service}/api/v1/jobs/{chain['search_job']}/choose"
    answer = httpx.post(path, json={"budget": {"params": 0.4, "kv_cache": 0.25}}, timeout=300)
    assert answer.status_code == 201, answer.text
    chosen = answer.json()
    assert chosen["kind"] == "chosen" and chosen["parent_id"] == chain["searched"]["id"]
    assert answer.headers["location"] == f"/api/v1/models/{chosen['id']}"
    assert len(chosen["architecture"]["blocks"]) == 4 and chosen["architecture"]["budget"] == {
        "params": 0.4,
        "kv_cache": 0.25,
    }
    assert chosen["architecture"]["reached"]["params"] <= 0.4 and chosen["architecture"]["reached"]["kv_cache"] <= 0.25
    assert chosen == httpx.get(f"{service}/api/v1/models/{chosen['id']}", timeout=30).json()
    refused = httpx.post(path, json={"budget": {"latency": 0.5}}, timeout=300)
    assert refused.status_code == 422 and "latency" in refused.json()["detail"]
    not_a_search = httpx.post(f"{service}/api/v1/jobs/{chain['teacher_job']}/choose", json={}, timeout=300)
    assert not_a_search.status_code == 422 and "not a transformer search" in not_a_search.json()["detail"]
    assert pipebd(["choose", str(chain["search_job"]), "--params", "0.5", "--server", service]) == 0
    assert "chosen from model" in capsys.readouterr().out
    assert len(models(service, kind="chosen")) == 2
