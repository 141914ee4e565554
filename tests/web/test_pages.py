"""Service tier: the dashboard's pages from the real app on a real database (TestClient, no browser).

What the server renders: list rows, filter and paging errors next to their field, the job page's
parts from real telemetry rows and run files, the compare table, the token login and what a
read-only token does not see.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, func, select

from app.core.database import get_engine
from app.core.settings import Settings
from app.core.tables import Job, JobEvent, JobMetric
from app.main import create_app
from app.web.new_job import bundled_examples
from pipebd_core.documents.architecture import Architecture, ArchitectureBlock, CandidateResult
from pipebd_core.documents.calibration import BlockCalibration, Calibration, CalibrationSource
from pipebd_core.documents.distill_plan import (
    PlanDocument,
    Predictions,
    RankEntry,
    Replan,
    StageEntry,
)
from pipebd_core.documents.summary import FinetuneReport, ModelSize, Summary
from pipebd_core.documents.telemetry import DistillLine
from pipebd_core.documents.trust import NoisyMeasurement, ProfileTrust
from pipebd_core.rundir import RunDir
from tests.service.conftest import make_settings
from tests.service.factories import insert_job, insert_metrics, store_lines, write_summary
from tests.telemetry_lines import distill_line

SUBMIT_TOKEN = "submit-token-0123456789abcdef"
READ_TOKEN = "read-token-0123456789abcdef"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sqlite_settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, f"sqlite:///{tmp_path / 'pipebd.db'}", stale_after_s=3600)


@pytest.fixture
def web(sqlite_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(sqlite_settings)) as test_client:
        yield test_client


def row_ids(html: str) -> list[int]:
    return [int(value) for value in re.findall(r'<tr id="job-(\d+)"', html)]


def embedded_json(html: str, element_id: str) -> Any:
    """The JSON a page hands its script in `<script type="application/json" id=...>`."""
    found = re.search(rf'<script type="application/json" id="{element_id}">(.*?)</script>', html, re.S)
    assert found is not None, f"no #{element_id} in the page"
    return json.loads(found.group(1))


def predictions(**fields: Any) -> Predictions:
    """The planner's predictions with the numbers a test gives, and nothing else to show."""
    nothing = {"alternatives": [], "mode_step_s": {}, "plans_considered": 0, "stages_rejected_for_memory": 0}
    return Predictions.model_validate(
        {"predicted_step_s": 0.0, "ideal_step_s": 0.0, "simulation": {}, **nothing, **fields}
    )


def write_run(folder: Path, nproc: int = 2) -> Path:
    """A run directory with a two-stage plan and lifecycle events, as a worker leaves it."""
    folder.mkdir(parents=True)
    plan = PlanDocument(
        mode="tr_dpu",
        nproc=nproc,
        num_blocks=4,
        batch_size=10,
        block_names=["b0", "b1", "b2", "b3"],
        stages=[
            StageEntry(start=0, stop=2, replicas=1, ranks=[0], rows=[(0, 10)]),
            StageEntry(start=2, stop=4, replicas=1, ranks=[1], rows=[(0, 10)]),
        ],
        ranks=[
            RankEntry(rank=0, blocks=[0, 1], rows=(0, 10), stage=0, role="stage"),
            RankEntry(rank=1, blocks=[2, 3], rows=(0, 10), stage=1, role="stage"),
        ],
    )
    (folder / "plan.json").write_text(json.dumps(plan.to_json()))
    events = [{"time": time.time(), "event": "prepared", "mode": "tr_dpu"}, {"time": time.time(), "event": "launched"}]
    (folder / "events.jsonl").write_text("".join(json.dumps(event) + "\n" for event in events))
    return folder


def test_jobs_page_lists_state_progress_plan_and_cancel_buttons(web: TestClient, sqlite_settings: Settings) -> None:
    queued = insert_job(sqlite_settings, "queued")
    running = insert_job(
        sqlite_settings,
        "running",
        started_at=time.time() - 30,
        progress=0.25,
        samples_per_s=123.4,
        plan_summary={
            "mode": "tr_dpu",
            "stages": [{"start": 0, "stop": 2, "replicas": 2}, {"start": 2, "stop": 4, "replicas": 1}],
        },
    )
    done = insert_job(sqlite_settings, "succeeded", started_at=time.time() - 60, finished_at=time.time(), progress=1.0)
    page = web.get("/")
    assert page.status_code == 200
    html = page.text
    assert row_ids(html) == [done.id, running.id, queued.id]
    assert re.findall(r'data-cancel="(\d+)"', html) == [str(running.id), str(queued.id)]
    assert "tr_dpu: 0–1 ×2 | 2–3" in html and "123" in html and "25%" in html
    assert 'href="/jobs/new"' in html


def test_state_filter_and_a_bad_state_shown_next_to_the_filter(web: TestClient, sqlite_settings: Settings) -> None:
    insert_job(sqlite_settings, "queued")
    running = insert_job(sqlite_settings, "running", started_at=time.time())
    assert row_ids(web.get("/", params={"state": "running"}).text) == [running.id]
    assert row_ids(web.get("/partials/jobs", params={"state": "running"}).text) == [running.id]
    bad = web.get("/", params={"state": "exploded"})
    assert bad.status_code == 422
    assert 'aria-invalid="true" aria-describedby="state-error"' in bad.text
    assert re.search(r'id="state-error">&#39;exploded&#39; is not a job state; pick one of queued', bad.text)


def test_cursor_pages_and_a_bad_cursor(web: TestClient, sqlite_settings: Settings) -> None:
    ids = [insert_job(sqlite_settings, "succeeded").id for _ in range(30)]
    first = web.get("/").text
    assert row_ids(first) == ids[::-1][:25]
    older = re.search(r'href="(/\?cursor=[^"]+)" rel="next"', first)
    assert older is not None
    second = web.get(older.group(1).replace("&amp;", "&")).text
    assert row_ids(second) == ids[::-1][25:]
    assert "Newest jobs" in second and 'rel="next"' not in second
    bad = web.get("/", params={"cursor": "nonsense"})
    assert bad.status_code == 422 and 'id="cursor-error"' in bad.text


def test_job_page_draws_plan_bottleneck_events_and_follows_from_the_last_event(
    client: TestClient, settings: Settings, tmp_path: Path
) -> None:
    run = write_run(tmp_path / "run")
    job = insert_job(
        settings,
        "running",
        started_at=time.time() - 5,
        heartbeat_at=time.time(),  # alive: the reaper leaves it running
        run_dir=str(run),
        plan_summary={"mode": "tr_dpu", "num_blocks": 4},
    )
    assert job.id is not None
    insert_metrics(settings, job.id, 0, [0.5, 0.4, 0.3])
    insert_metrics(settings, job.id, 1, [0.9, 0.8])
    page = client.get(f"/jobs/{job.id}")
    assert page.status_code == 200
    html = page.text
    config = embedded_json(html, "job-config")
    with Session(get_engine(settings.database)) as session:
        newest = session.exec(select(func.max(JobEvent.id)).where(JobEvent.job_id == job.id)).one()
    assert newest is not None and config["afterEventId"] == newest  # the stream resumes after what was drawn
    assert config["nproc"] == 2 and config["numBlocks"] == 4 and config["canSubmit"] is True
    assert 'id="bottleneck-statement" data-rank="' in html
    assert re.findall(r'<tr data-rank="(\d)"', html) == ["0", "1"]
    assert "prepared" in html and "launched" in html and "Cancel job" in html
    for part in ("status", "bottleneck", "plan", "artifacts", "events", "architecture"):
        assert client.get(f"/jobs/{job.id}/partials/{part}").status_code == 200, part
    assert "plan.json" in client.get(f"/jobs/{job.id}/partials/artifacts").text
    unknown = client.get(f"/jobs/{job.id}/partials/secrets")
    assert unknown.status_code == 404 and "has no part" in unknown.text
    missing = client.get("/jobs/987654")
    assert missing.status_code == 404 and "Job 987654 does not exist" in missing.text


def test_failed_job_page_shows_reason_and_traceback(web: TestClient, sqlite_settings: Settings) -> None:
    error = 'Traceback (most recent call last):\n  File "x.py"\nValueError: block <2> diverged'
    job = insert_job(sqlite_settings, "failed", termination_reason="rank_error", error=error, exit_code=1)
    html = web.get(f"/jobs/{job.id}").text
    assert "Ended: rank_error" in html and "A rank raised an exception" in html
    assert "ValueError: block &lt;2&gt; diverged" in html and "Exit code 1." in html
    assert "Cancel job" not in html


def test_new_job_page_is_prefilled_from_the_bundled_examples(web: TestClient) -> None:
    page = web.get("/jobs/new")
    assert page.status_code == 200
    examples = embedded_json(page.text, "examples-data")
    assert examples == bundled_examples() and "tiny-custom.yaml" in examples
    assert "name: tiny-custom" in page.text  # the editor starts with the tiny example
    assert '"apiUrl": "http://testserver/api/v1/jobs"' in page.text
    unknown = web.get("/jobs/new", params={"example": "nope.yaml"})
    assert unknown.status_code == 422 and 'id="example-error"' in unknown.text


MIB = 2**20
IR_PLAN = {"mode": "auto", "nproc": 2, "num_blocks": 2, "stages": [{"start": 0, "stop": 2, "replicas": 2}]}


def insert_submitted(settings: Settings, mode: str, **fields: Any) -> Job:
    """A job as submitted in `mode` (2 ranks, batches of 10 rows)."""
    job = insert_job(settings, **fields)
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        stored = session.get(Job, job.id)
        assert stored is not None
        stored.spec = {**stored.spec, "schedule": {**stored.spec["schedule"], "mode": mode}}
        session.add(stored)
        session.commit()
        return stored


def telemetry(rank: int, task_s: float, losses: list[dict[str, float]], peak_mib: int) -> list[DistillLine]:
    """Back-to-back tasks of `task_s` seconds on 5 rows (half the batch), task i training the blocks of
    `losses[i]` (block -> loss); the rank's memory peaks at `peak_mib` from its 7th task on."""
    return [
        distill_line(
            rank,
            i - 1,
            time=1000.0 + i * task_s,
            loss={int(block): value for block, value in loss.items()},
            phases={"teacher": 0.4 * task_s, "student": 0.4 * task_s, "allreduce": 0.2 * task_s},
            samples=5,
            peak_mem=(peak_mib if i >= 7 else 100) * MIB,
            done=i,
            total=len(losses),
        )
        for i, loss in enumerate(losses, start=1)
    ]


def compare_cells(html: str, job_id: int | None) -> dict[str, str]:
    """The text of each classed cell of a job's row of the compare table (its key-value items joined by ` | `)."""
    row = re.search(rf'<tr data-job="{job_id}">(.*?)</tr>', html, re.S)
    assert row is not None, f"no row for job {job_id}"
    cells = re.findall(r'<td class="([a-z-]+)">(.*?)</td>', row.group(1), re.S)
    return {
        name: " | ".join(re.findall(r'<span class="kv">(.*?)</span>', text)) or re.sub(r"<[^>]+>", "", text)
        for name, text in cells
    }


def test_compare_table_computes_speed_up_memory_and_losses_from_telemetry(
    web: TestClient, sqlite_settings: Settings
) -> None:
    # dp: each rank trains one block per 1 s task (block 0 for 5 tasks, then block 1) on 5 rows; the
    # model has 2 blocks, so each task distils 5 x 1/2 samples: 2 ranks x 2.5 / 1 s = 5 samples/s.
    dp = insert_submitted(sqlite_settings, "dp", state="succeeded", plan_summary={"mode": "dp", "num_blocks": 2})
    # auto chose ir: each rank trains both blocks per 0.5 s task on 5 rows: 2 x (5 x 2/2) / 0.5 s = 20 samples/s
    auto = insert_submitted(sqlite_settings, "auto", state="succeeded", plan_summary=IR_PLAN)
    assert dp.id is not None and auto.id is not None
    for rank in (0, 1):
        dp_losses = [{"0" if i <= 5 else "1": 1 / i + 0.1 * rank} for i in range(1, 11)]
        store_lines(sqlite_settings, dp.id, telemetry(rank, 1.0, dp_losses, 200 + 100 * rank))
        ir_losses = [{"0": 0.5 / i + 0.01 * rank, "1": 0.8 / i + 0.01 * rank} for i in range(1, 11)]
        store_lines(sqlite_settings, auto.id, telemetry(rank, 0.5, ir_losses, 150))
    page = web.get("/compare", params={"ids": f"{auto.id},{dp.id}"})
    assert page.status_code == 200
    assert re.findall(r'<tr data-job="(\d+)"', page.text) == [str(auto.id), str(dp.id)]
    assert re.search(rf'#{dp.id} tiny</a> <span class="tag">baseline</span>', page.text)  # dp, though listed second
    cells = compare_cells(page.text, auto.id)
    assert cells["mode"] == "auto → ir: 0–1 ×2"  # as submitted, what auto chose, and its plan
    assert cells["rate"] == "20.0" and cells["step"] == "500 ms"  # batches of 10 rows at 20 samples/s
    assert cells["speedup"] == "×4.00"  # 20 / 5 samples/s
    assert cells["peak-mem"] == "150.0 MiB"
    # each block's loss at its latest step (9), averaged over the ranks: (0.05 + 0.06) / 2, (0.08 + 0.09) / 2
    assert cells["losses"] == "0: 0.055 | 1: 0.085"
    cells = compare_cells(page.text, dp.id)
    assert cells["mode"] == "dp: 2 ranks, data parallel per block"
    assert cells["rate"] == "5.0" and cells["step"] == "2000 ms" and cells["speedup"] == "×1.00"
    assert cells["peak-mem"] == "300.0 MiB"  # rank 1's peak, the higher
    assert cells["losses"] == "0: 0.25 | 1: 0.15"  # block 0 last at step 4: (0.2 + 0.3) / 2; block 1: (0.1 + 0.2) / 2
    config = embedded_json(page.text, "compare-config")
    assert [job["mode"] for job in config] == ["auto → ir", "dp"]  # the curves' legend
    assert f'#{auto.id} tiny <span class="subtle">(auto → ir, succeeded)' in page.text  # the picker
    table = web.get("/compare/partials/table", params={"ids": f"{dp.id},{auto.id}"})
    assert compare_cells(table.text, auto.id)["speedup"] == "×4.00"


def test_auto_jobs_say_what_auto_chose_on_the_list_and_the_job_page(
    web: TestClient, sqlite_settings: Settings, tmp_path: Path
) -> None:
    run = write_run(tmp_path / "run")  # two unreplicated stages on 2 ranks: the layout tr_dpu runs
    document = PlanDocument.from_json(json.loads((run / "plan.json").read_text()))
    document.mode = "auto"
    document.details.predictions = predictions(mode_step_s={"dp": 0.04, "ir": 0.02, "tr_dpu": 0.01, "hybrid": 0.01})
    plan = document.to_json()
    (run / "plan.json").write_text(json.dumps(plan))
    summary = {key: plan[key] for key in ("mode", "nproc", "num_blocks", "stages")}
    auto = insert_submitted(sqlite_settings, "auto", state="succeeded", run_dir=str(run), plan_summary=summary)
    waiting = insert_submitted(sqlite_settings, "auto", state="queued")
    listing = web.get("/").text
    assert re.search(rf'id="job-{auto.id}".*?<td data-label="Plan">auto → tr_dpu: 0–1 \| 2–3</td>', listing, re.S)
    assert re.search(rf'id="job-{waiting.id}".*?<td data-label="Plan">auto on 2 ranks, planned when', listing, re.S)
    page = web.get(f"/jobs/{auto.id}").text
    assert "<dt>Plan</dt><dd>auto → tr_dpu: 0–1 | 2–3</dd>" in page
    assert '<strong id="plan-mode">auto → tr_dpu</strong>' in page and "laid out as mode tr_dpu would be" in page
    assert re.findall(r'<tr class="chosen"><td>(\w+)</td>', page) == ["tr_dpu"]  # its row of predicted steps


def test_compare_ids_errors_are_shown_next_to_the_field(web: TestClient) -> None:
    for ids, message in (
        ("abc", "&#39;abc&#39; is not a job id"),
        ("424242", "job 424242 does not exist"),
        ("1,2,3,4,5,x", "&#39;x&#39; is not a job id"),
    ):
        bad = web.get("/compare", params={"ids": ids})
        assert bad.status_code == 422 and 'id="ids-error"' in bad.text and message in bad.text, ids


def test_static_files_are_served_with_the_vendored_chart_library(web: TestClient) -> None:
    script = web.get("/static/js/job.js")
    assert script.status_code == 200 and "javascript" in script.headers["content-type"]
    assert script.headers["cache-control"] == "no-cache"
    vendor = next((REPO / "app" / "static" / "vendor").glob("uplot-*"))
    assert (vendor / "LICENSE").is_file()
    assert web.get(f"/static/vendor/{vendor.name}/uPlot.esm.js").status_code == 200
    imported = re.search(r'from "\.\./vendor/([^/]+)/uPlot\.esm\.js"', (REPO / "app/static/js/charts.js").read_text())
    assert imported is not None and imported.group(1) == vendor.name


ASSET_TYPES = {".js": "javascript", ".css": "text/css", ".svg": "image/svg+xml"}


def page_assets(html: str) -> list[str]:
    """Every URL a page's tags load or link to (`src=` and `href=`), in order."""
    return re.findall(r'\b(?:src|href)="([^"]*)"', html)


def assert_local_assets(client: TestClient, page: str) -> list[str]:
    """The page names only /static files (which answer with their type) and nothing off the machine."""
    html = client.get(page).text
    assert "<script" in html and not re.search(r"https?://|//cdn|jsdelivr|googleapis|unpkg", html), html
    assets = page_assets(html)
    assert assets, html
    for url in assets:
        assert url.startswith("/static/"), (page, url)
        answer = client.get(url)
        kind = ASSET_TYPES[Path(url).suffix]
        assert answer.status_code == 200 and kind in answer.headers["content-type"], (page, url, answer.status_code)
        assert len(answer.content) > 0, url
    return assets


def test_api_docs_load_their_vendored_swagger_ui_and_redoc_not_a_cdn(web: TestClient) -> None:
    swagger = assert_local_assets(web, "/docs")
    assert any(url.endswith("/swagger-ui-bundle.js") for url in swagger)
    assert any(url.endswith("/swagger-ui.css") for url in swagger)
    redoc = assert_local_assets(web, "/redoc")
    assert any(url.endswith("/redoc.standalone.js") for url in redoc)
    for url in swagger + redoc:
        local = REPO / "app" / url.removeprefix("/")
        assert local.is_file(), url
        if "/vendor/" in url:  # each vendored library keeps its licence and where it came from
            assert (local.parent / "LICENSE").is_file() and (local.parent / "SOURCE").is_file(), url


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[TestClient, Settings]]:
    tokens = f"{SUBMIT_TOKEN}=submit,{READ_TOKEN}=read"
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'pipebd.db'}", api_tokens=tokens, stale_after_s=3600)
    with TestClient(create_app(settings)) as test_client:
        yield test_client, settings


def log_in(client: TestClient, token: str, target: str = "/") -> Any:
    return client.post("/login", data={"token": token, "next": target}, follow_redirects=False)


def test_pages_ask_for_a_token_once_and_keep_it_in_a_cookie(secured: tuple[TestClient, Settings]) -> None:
    client, settings = secured
    job = insert_job(settings, "running", started_at=time.time())
    first = client.get(f"/jobs/{job.id}", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == f"/login?next=/jobs/{job.id}"
    assert client.get("/partials/jobs", follow_redirects=False).status_code == 303
    wrong = log_in(client, "not-a-known-token-at-all")
    assert wrong.status_code == 401 and 'id="token-error"' in wrong.text and "does not know that token" in wrong.text
    answer = log_in(client, SUBMIT_TOKEN, f"/jobs/{job.id}")
    assert answer.status_code == 303 and answer.headers["location"] == f"/jobs/{job.id}"
    cookie = answer.headers["set-cookie"]
    assert cookie.startswith(f"pipebd_token={SUBMIT_TOKEN};") and "HttpOnly" in cookie and "SameSite=lax" in cookie
    page = client.get(f"/jobs/{job.id}")
    assert page.status_code == 200 and "Cancel job" in page.text
    assert client.get(f"/api/v1/jobs/{job.id}").status_code == 200  # the API takes the same cookie
    assert client.post("/logout", follow_redirects=False).headers["location"] == "/login"
    assert client.get("/", follow_redirects=False).status_code == 303


def test_read_only_tokens_see_no_submit_or_cancel_controls(secured: tuple[TestClient, Settings]) -> None:
    client, settings = secured
    job = insert_job(settings, "running", started_at=time.time())
    assert log_in(client, READ_TOKEN).status_code == 303
    listing = client.get("/").text
    assert "data-cancel" not in listing and 'href="/jobs/new"' not in listing and "read-only token" in listing
    assert "Cancel job" not in client.get(f"/jobs/{job.id}").text
    new = client.get("/jobs/new")
    assert new.status_code == 403 and "Read-only token" in new.text


def test_with_tokens_the_api_docs_need_a_login_but_their_assets_do_not(secured: tuple[TestClient, Settings]) -> None:
    client, _ = secured
    for page in ("/docs", "/redoc"):
        assert client.get(page, follow_redirects=False).status_code == 303
    assert log_in(client, READ_TOKEN, "/docs").status_code == 303
    pages = {page: client.get(page) for page in ("/docs", "/redoc")}
    client.cookies.clear()
    for page, answer in pages.items():
        assert answer.status_code == 200, page
        for url in page_assets(answer.text):  # the browser fetches these with the cookie, but needs none
            assert client.get(url, follow_redirects=False).status_code == 200, url


def test_login_never_redirects_off_site(secured: tuple[TestClient, Settings]) -> None:
    client, _ = secured
    for target in ("//evil.example/x", "https://evil.example/", "/\\evil"):
        assert log_in(client, READ_TOKEN, target).headers["location"] == "/", target


def test_without_tokens_the_login_page_sends_you_on(web: TestClient) -> None:
    answer = web.get("/login", params={"next": "/compare"}, follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/compare"


def uniform(count: int, lead: int | None = None, p: float = 0.0) -> list[float]:
    """`count` candidate probabilities: equal, or `lead` at `p` and the rest sharing what is left."""
    if lead is None:
        return [1.0 / count] * count
    rest = (1.0 - p) / (count - 1)
    return [p if index == lead else rest for index in range(count)]


def test_nas_jobs_show_each_blocks_candidate_probabilities_over_time(client: TestClient, settings: Settings) -> None:
    job = insert_job(settings, "running", started_at=time.time(), heartbeat_at=time.time())
    assert job.id is not None
    # block 0: layer 0 may be skipped (7 candidates: 6 MBConv and zero), layer 1 may not (6); it first
    # leans to mbconv_k3_e3, then settles on zero. Block 1 is updated 60 times, by two replicas.
    updates = {
        4: {"0": [uniform(7), uniform(6)]},
        8: {"0": [uniform(7, lead=0, p=0.4), uniform(6, lead=3, p=0.3)]},
        12: {"0": [uniform(7, lead=6, p=0.55), uniform(6, lead=3, p=0.5)]},
    }
    with Session(get_engine(settings.database)) as session:
        seq = 0
        for step, arch in updates.items():
            seq += 1
            weights = distill_line(0, step, time=1.0, done=seq).to_json()
            session.add(JobMetric(job_id=job.id, rank=0, seq=seq, epoch=0, step=step, time=1.0, record=weights))
            seq += 1
            record = distill_line(0, step, time=1.0, done=seq, round="arch", loss={}, blocks=[0], arch=arch).to_json()
            session.add(JobMetric(job_id=job.id, rank=0, seq=seq, epoch=0, step=step, time=1.0, record=record))
        for step in range(60):
            for rank in (0, 1):
                arch = {"1": [uniform(6, lead=1, p=0.2 + 0.01 * step)]}
                line = distill_line(
                    rank, step, time=1.0, done=1000 + step, round="arch", loss={}, blocks=[1], arch=arch
                )
                session.add(
                    JobMetric(
                        job_id=job.id, rank=rank, seq=1000 + step, epoch=0, step=step, time=1.0, record=line.to_json()
                    )
                )
        stored = session.get(Job, job.id)
        assert stored is not None
        stored.spec = {**stored.spec, "workload": {"kind": "nas"}}
        session.add(stored)
        session.commit()
    page = client.get(f"/jobs/{job.id}").text
    assert re.search(r'<section class="card" id="part-architecture" aria-label="Architecture search">', page)  # shown
    part = client.get(f"/jobs/{job.id}/partials/architecture").text
    first, second = part.split('<section class="arch-block"')[1:]
    assert 'data-block="0"' in first and 'data-block="1"' in second
    steps = [re.findall(r'<span class="visually-hidden">step </span>(\d+)</th>', block) for block in (first, second)]
    assert steps[0] == ["4", "8", "12"]  # every update of block 0, oldest first
    assert len(steps[1]) == 24 and steps[1][0] == "0" and steps[1][-1] == "59"  # 60 updates, thinned, ends kept
    assert "24 of its 60 updates (evenly spaced)" in second and 'data-updates="60"' in second
    rows = first.split("<tbody>")[1].split("</tbody>")[0].split("<tr>")[1:]
    # each layer's choice now and, per update, how likely that choice was (percent) and who led instead
    assert re.search(r'<td class="choice"><span class="mono">zero</span> 55%</td>', rows[0])
    assert re.search(r'<td class="choice"><span class="mono">mbconv_k5_e6</span> 50%</td>', rows[1])
    cells = [re.findall(r"<td style=\"--p: ([0-9.]+)\"[^>]*>(\d+)", row) for row in rows]
    assert cells[0] == [("0.143", "14"), ("0.100", "10"), ("0.550", "55")]
    assert cells[1] == [("0.167", "17"), ("0.300", "30"), ("0.500", "50")]
    assert re.findall(r'class="other" title="([^"]+)"', rows[0]) == ["step 8: zero 10.0%; mbconv_k3_e3 led with 40.0%"]
    assert "%, mbconv_k3_e3 led with 40%</span>" in rows[0]  # the same, for screen readers
    # every candidate at the newest update, by name, the most likely marked
    latest = first.split('<details class="arch-latest"')[1]
    names = re.findall(r'<th scope="col" class="mono">([a-z0-9_]+)</th>', latest)
    assert names == [
        "mbconv_k3_e3",
        "mbconv_k3_e6",
        "mbconv_k5_e3",
        "mbconv_k5_e6",
        "mbconv_k7_e3",
        "mbconv_k7_e6",
        "zero",
    ]
    assert re.findall(r'class="best">([0-9.]+) ★', latest) == ["0.55", "0.50"]
    assert latest.count("no candidate") == 1  # layer 1 cannot be skipped: no zero cell
    assert "c0" not in part
    plain = insert_job(settings, "succeeded")
    assert "heatmap" not in client.get(f"/jobs/{plain.id}/partials/architecture").text


def test_compare_shows_accuracies_parameters_and_phase_times_of_jobs_that_trained_end_to_end(
    web: TestClient, sqlite_settings: Settings, tmp_path: Path
) -> None:
    run = tmp_path / "tuned"
    run.mkdir()
    student = ModelSize(params=1234567, flops=2e6)
    report = FinetuneReport(strategy="ddp", top1_before=0.912, top1_after=0.975, teacher_top1=0.981, student=student)
    RunDir(run).save_summary(Summary(name="tuned", finetune=report))
    phases = [
        {"name": "distill", "state": "ended", "outcome": "succeeded", "started_at": 100.0, "ended_at": 160.0},
        {"name": "profile_finetune", "state": "ended", "outcome": "skipped", "started_at": 160.0, "ended_at": 160.0},
        {"name": "finetune", "state": "ended", "outcome": "succeeded", "started_at": 160.0, "ended_at": 172.5},
    ]
    tuned = insert_submitted(sqlite_settings, "dp", state="succeeded", run_dir=str(run), phases=phases)
    plain = insert_submitted(sqlite_settings, "dp", state="succeeded")
    page = web.get("/compare", params={"ids": f"{tuned.id},{plain.id}"}).text
    row = re.search(rf'<tr data-job="{tuned.id}">.*?</tr>', page, re.S)
    assert row is not None
    cells = row.group(0)
    assert '<td class="top1">91.2% → 97.5% (98.1%)</td>' in cells and '<td class="params">1,234,567</td>' in cells
    assert "distill 1 min 00 s" in cells and "profile_finetune skipped" in cells and "finetune 12.5 s" in cells
    other = re.search(rf'<tr data-job="{plain.id}">.*?</tr>', page, re.S)
    assert other is not None and '<td class="top1">—</td>' in other.group(0)


def test_job_page_says_how_far_the_profile_is_trusted_what_training_measured_and_each_replan(
    web: TestClient, sqlite_settings: Settings, tmp_path: Path
) -> None:
    run = write_run(tmp_path / "run")
    plan = PlanDocument.from_json(json.loads((run / "plan.json").read_text()))
    plan.details.predictions = predictions(predicted_step_s=0.012, ideal_step_s=0.015)
    plan.details.profile_trust = ProfileTrust(
        trusted=False,
        flags=["noisy", "busy"],
        messages=["noisy: 1 measurements disagree after re-measuring (block 1 student at batch 10 spread 1.70)"],
        noisy=[NoisyMeasurement(what="block 1 student", block=1, batch=10, spread=1.7, remeasured=2)],
        other_cpu_cores=0.9,
        age_s=None,
        calibrated_from=None,
    )
    before = [
        StageEntry(start=0, stop=3, replicas=1, ranks=[0], rows=[(0, 10)]),
        StageEntry(start=3, stop=4, replicas=1, ranks=[1], rows=[(0, 10)]),
    ]
    plan.details.replans = [
        Replan(
            at=time.time() - 5,
            decided_at_step=39,
            resumed_at_step=40,
            from_=before,
            to=plan.stages,
            measured_before_s=0.02,
            predicted_before_s=0.04,
            predicted_after_s=0.012,
            measured_after_s=0.0125,
            reason="measured 50% off the prediction; a plan 40% faster",
        )
    ]
    (run / "plan.json").write_text(json.dumps(plan.to_json()))
    block = BlockCalibration(teacher=1.5, student=0.8, teacher_s=0.002, student_s=0.003)
    source = CalibrationSource(run="run", steps=[2, 40], at=time.time())
    calibration = Calibration(blocks=[block] * 4, measured_step_s=0.0125, source=source)
    (run / "calibration.json").write_text(json.dumps(calibration.to_json()))
    phases = [{"name": "distill", "state": "running", "started_at": time.time() - 10}]
    # the job's figures: 800 samples/s at batches of 10 is a measured step of 12.5 ms
    job = insert_job(
        sqlite_settings, "running", started_at=time.time() - 10, run_dir=str(run), phases=phases, samples_per_s=800.0
    )
    html = web.get(f"/jobs/{job.id}").text
    assert 'id="profile-trust" data-flags="noisy busy"' in html and "Profile: noisy, busy" in html
    assert "block 1 student at batch 10 spread 1.70" in html
    assert "At step 40: <strong>0–2 | 3</strong> → <strong>0–1 | 2–3</strong>" in html
    assert 'data-count="1"' in html and "re-planned at step 40: 0–1 | 2–3" in html  # also on the timeline
    rows = re.findall(r'<tr data-block="(\d)">.*?×([\d.]+)</td>.*?×([\d.]+)</td>', html, re.S)
    assert rows == [(str(b), "1.50", "0.80") for b in range(4)] and "Measured over steps 2–40." in html
    step = re.search(r'<span id="plan-step">(.*?)</span>', html, re.S)  # predicted beside measured, no bound
    assert step is not None and "Predicted step: <strong>12.00 ms</strong>" in step.group(1)
    assert 'measured: <strong id="plan-measured">12.50 ms</strong> (over each rank' in step.group(1)
    assert "15.00 ms, a prediction, not a bound (this plan is predicted below it" in step.group(1)


def test_the_outcome_part_shows_each_budget_and_cost_reached_with_every_candidates_kv_cache(
    web: TestClient, sqlite_settings: Settings, tmp_path: Path
) -> None:
    run = tmp_path / "searched"
    run.mkdir()
    candidates = [
        CandidateResult(block=b, name=name, loss=loss, params=params, kv_cache_bytes=kv)
        for b in (0, 1)
        for name, loss, params, kv in (("keep", 0.0, 1000, 64), ("linear_attention", 0.3 + b, 1128, 0))
    ]
    architecture = Architecture(
        blocks=[
            ArchitectureBlock(block=0, layers=["keep"], loss=0.0, params=1000, kv_cache_bytes=64),
            ArchitectureBlock(block=1, layers=["linear_attention"], loss=1.3, params=1128, kv_cache_bytes=0),
        ],
        candidates=candidates,
        chosen_by="lowest summed held-out loss within the budget (mixed-integer program)",
        teacher_params=2000,
        teacher_kv_cache_bytes=128,
        budget={"kv_cache": 0.5},
        reached={"params": 1.064, "kv_cache": 0.5},
    )
    (run / Architecture.NAME).write_text(json.dumps(architecture.to_json()))
    job = insert_submitted(sqlite_settings, "tr", state="succeeded", run_dir=str(run))
    part = web.get(f"/jobs/{job.id}/partials/outcome").text
    paragraph = part.split('id="outcome-budget">')[1].split("</p>")[0]
    budget = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", paragraph))
    assert "Budget: kv_cache at most 50.0% of the teacher's layers" in budget
    assert "params 106.4% (2,128 of 2,000 parameters)" in budget
    assert "kv_cache 50.0% (64 of 128 KV-cache bytes per token)" in budget
    chosen = re.findall(r'<td class="chosen">([0-9.]+) <small>([0-9,]+) · (\d+) B</small>', part)
    assert chosen == [("0", "1,000", "64"), ("1.3", "1,128", "0")]


def test_a_language_model_s_outcome_shows_parameters_and_kv_cache_before_and_after_beside_perplexity(
    web: TestClient, sqlite_settings: Settings
) -> None:
    job = insert_submitted(sqlite_settings, "tr_dpu", state="succeeded")
    assert job.id is not None
    summary = Summary(
        name="lm",
        student_perplexity=14.25,
        teacher_perplexity=13.5,
        student_params=60_000,
        teacher_params=80_000,
        student_kv_cache_bytes=512,
        teacher_kv_cache_bytes=1024,
    )
    write_summary(sqlite_settings, job.id, summary)
    part = web.get(f"/jobs/{job.id}/partials/outcome").text
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", part))
    assert "Held-out perplexity: distilled 14.25, teacher 13.50" in text
    assert "Parameters: distilled 60,000, teacher 80,000 (75.0% of it)" in text
    assert "KV cache per token: distilled 512 B, teacher 1,024 B (50.0% of it)" in text
    assert part.index('id="outcome-perplexity"') < part.index('id="outcome-sizes"')  # beside the perplexity
