"""Browser tier: Debian's Chromium driven by Playwright against the real service, `pipebd up` (API,
worker, SQLite database and broker) running real torchrun jobs of 2 gloo ranks on the CPU.

One service for the module. A job is submitted through the form (the README's quick-start example,
examples/tiny-custom.yaml as the form offers it, after a bad field was shown next to its line, the page
fitting a phone screen) and followed on its page until `succeeded` while the loss chart gains points
without a reload, its outputs then downloading byte for byte; the schedules have one row per rank and
the bottleneck is named; a running job is cancelled from the list with the keyboard; the compare page shows both, each
measured one with a numeric speed-up and its mode as submitted (the values themselves are checked
from known telemetry in test_pages.py). No console errors; screenshots go to test-output/.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.core.states import FINAL
from tests.helpers import ROOT
from tests.service.downloads import assert_outputs_download
from tests.service.factories import long_job, tiny_job
from tests.service.workers import wait_for
from tests.web.browser import DESKTOP, NETWORK_ERROR, PHONE, Watched, pipebd_up, watched_page

pytestmark = pytest.mark.timeout(600)
JOB_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def dashboard_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard")


@pytest.fixture(scope="module")
def service(dashboard_dir: Path) -> Iterator[str]:
    with pipebd_up(dashboard_dir) as url:
        yield url


def api_job(service: str, job_id: int) -> dict[str, Any]:
    answer: dict[str, Any] = httpx.get(f"{service}/api/v1/jobs/{job_id}", timeout=30).json()
    return answer


def wait_until_ready(watched: Watched) -> None:
    watched.page.wait_for_selector("body[data-ready='1']")
    watched.page.evaluate("window.__sameDocument = true")  # gone if the page ever reloads


# Every value the loss chart's point count takes, recorded in the page itself, so that no update is
# missed between two polls from the test on a busy machine.
RECORD_LOSS_POINTS = """() => {
    const chart = document.querySelector('#chart-loss');
    window.__lossPoints = [];
    new MutationObserver(() => window.__lossPoints.push(Number(chart.dataset.points || 0)))
        .observe(chart, {attributes: true, attributeFilter: ['data-points']});
}"""


def follow_job_page(watched: Watched) -> list[tuple[str, int, str]]:
    """(state, loss points drawn, current phase shown) every 0.2 s until the page says the job ended."""
    page, seen = watched.page, []
    deadline = time.time() + JOB_TIMEOUT_S
    while time.time() < deadline:
        state = page.locator("#status").get_attribute("data-state") or ""
        points = int(page.locator("#chart-loss").get_attribute("data-points") or 0)
        phase = page.locator("#current-phase").inner_text() if page.locator("#current-phase").count() else ""
        seen.append((state, points, phase))
        if state in FINAL and page.locator("body[data-stream-ended='1']").count():
            return seen
        time.sleep(0.2)
    raise AssertionError(f"the job page did not reach a final state within {JOB_TIMEOUT_S} s: {seen[-5:]}")


def submit_bad_then_good(watched: Watched) -> int:
    page = watched.page
    page.goto("/jobs/new")
    wait_until_ready(watched)
    editor = page.locator("#spec")
    example = editor.input_value()
    assert example == (ROOT / "examples" / "tiny-custom.yaml").read_text()  # the README's quick-start example
    bad = example.replace("  nproc: 2", "  nproc: 0")
    editor.fill(bad)
    page.click("#submit-job")
    page.wait_for_selector("#spec-errors li")
    line = bad.splitlines().index("  nproc: 0") + 1
    assert page.locator("#spec-errors li").first.inner_text().startswith(f"Line {line} · schedule.nproc: ")
    assert page.locator("#spec-gutter .bad").all_inner_texts() == [str(line)]
    assert "nproc must be at least 1; got 0" in page.locator("#spec-backdrop .inline-error").inner_text()
    assert editor.get_attribute("aria-invalid") == "true"
    assert "  nproc: 0" in (page.locator("#curl-command").text_content() or "")  # inside a closed <details>
    watched.screenshot("new-job-field-error")
    page.set_viewport_size(PHONE)  # the editor and its error list fit a phone: nothing to scroll sideways
    page.wait_for_timeout(300)
    assert watched.overflow() == 0
    watched.screenshot("new-job-field-error-390")
    page.set_viewport_size(DESKTOP)
    # the only console line so far is the browser's own report of the API's 422 answer
    assert [error.split(" (")[0] for error in watched.errors] == [NETWORK_ERROR.format(status=422)]
    watched.errors.clear()
    editor.fill(example.replace("epochs: 2", "epochs: 120"))  # 960 steps, ~5 s alone here: several telemetry flushes
    page.click("#submit-job")
    page.wait_for_url(re.compile(r"/jobs/\d+$"))
    return int(page.url.rsplit("/", 1)[1])


def test_submit_through_the_form_and_watch_the_job_to_success(browser: Any, service: str, dashboard_dir: Path) -> None:
    with watched_page(browser, service) as watched:
        job_id = submit_bad_then_good(watched)
        wait_until_ready(watched)
        watched.page.evaluate(RECORD_LOSS_POINTS)
        seen = follow_job_page(watched)
        page = watched.page
        assert seen[-1][0] == "succeeded", api_job(service, job_id)
        assert page.evaluate("window.__sameDocument") is True
        drawn = sorted({points for points in page.evaluate("window.__lossPoints") if points > 0})
        assert len(drawn) >= 3, f"the loss chart did not gain points live: {drawn} (polled: {seen})"
        shown = [phase.split()[0] for _, _, phase in seen if phase.strip() not in ("", "—")]
        assert "distill" in shown and shown[-1] == "finalize", shown  # the phase followed live, no reload
        timeline = page.locator("#phase-timeline li")
        statuses = dict(
            zip(
                timeline.evaluate_all("els => els.map(e => e.dataset.phase)"),
                timeline.evaluate_all("els => els.map(e => e.dataset.status)"),
                strict=True,
            )
        )
        assert list(statuses) == ["profile", "plan", "distill", "finalize"]
        assert statuses["profile"] in ("succeeded", "skipped") and set(list(statuses.values())[1:]) == {"succeeded"}
        history = httpx.get(f"{service}/api/v1/jobs/{job_id}/metrics?max_points=10000", timeout=30).json()
        assert drawn[-1] == sum(len(point["loss"]) for point in history["points"])  # each loss once, none lost
        assert page.locator("#gantt-measured g.gantt-row").count() == 2
        assert page.locator("#gantt-predicted g.gantt-row").count() == 2
        for rank in (0, 1):
            assert page.locator(f"#gantt-measured g.gantt-row[data-rank='{rank}'] rect.seg").count() > 0
        statement = page.locator("#bottleneck-statement")
        assert statement.get_attribute("data-rank") in ("0", "1")
        assert re.match(
            r"(Rank [01] \(stage [01], blocks .*\) is the bottleneck|The ranks are evenly loaded)",
            statement.inner_text(),
        )
        assert page.locator("#plan-grid tbody tr").count() == 2 and page.locator("#alternatives").count() == 1
        assert page.locator("#artifact-list a", has_text="student.pt").count() == 1
        with httpx.Client(base_url=service, timeout=30) as client:  # and each output downloads byte for byte
            run = dashboard_dir / "data" / "runs" / f"job-{job_id}"
            assert_outputs_download(client, run, job_id, {"student.pt", "summary.json", "plan.json", "events.jsonl"})
        page.check("#loss-range")  # each point's min and max loss join the chart
        assert page.locator("#chart-loss .u-legend", has_text="block 0 max").count() == 1
        log = page.locator("#log-text").inner_text()  # read from the run directory (a tiny job writes nothing)
        assert log.strip() and not log.startswith(("No logs yet", "Could not read")), log
        watched.screenshot("job-page-1280")
        page.set_viewport_size(PHONE)
        page.wait_for_timeout(300)
        assert watched.overflow() == 0
        watched.screenshot("job-page-390")
        assert watched.errors == []


def test_cancel_a_running_job_from_the_list_with_the_keyboard(browser: Any, service: str) -> None:
    submitted = httpx.post(f"{service}/api/v1/jobs", json=long_job(), timeout=60)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    wait_for(lambda: api_job(service, job_id)["state"] == "running", 120, "the long job to run")
    with watched_page(browser, service) as watched:
        page = watched.page
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto("/")
        wait_until_ready(watched)
        for _ in range(60):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.id") == f"cancel-{job_id}":
                break
        else:
            raise AssertionError("the cancel button cannot be reached with the Tab key")
        watched.screenshot("jobs-list-cancel-focused")
        page.keyboard.press("Enter")
        page.wait_for_selector(f"#job-{job_id}[data-state='cancelled']", timeout=60_000)
        assert page.evaluate("window.__sameDocument") is True
        assert page.locator(f"#cancel-{job_id}").count() == 0
        job = api_job(service, job_id)
        assert job["state"] == "cancelled" and job["termination_reason"] == "user_cancelled"
        watched.screenshot("jobs-list-1280")
        page.set_viewport_size(PHONE)
        page.wait_for_timeout(300)
        assert watched.overflow() == 0
        watched.screenshot("jobs-list-390")
        assert watched.errors == []


def finished_jobs(service: str, count: int) -> list[int]:
    """The newest finished jobs of this service; tiny ones are run first when there are too few."""

    def finished() -> list[int]:
        jobs = httpx.get(f"{service}/api/v1/jobs?limit=50", timeout=30).json()["data"]
        return [job["id"] for job in jobs if job["state"] in FINAL]

    for mode, nproc in (("dp", 1), ("tr_dpu", 2))[: max(0, count - len(finished()))]:
        spec = tiny_job(f"tiny-{mode}", schedule={"mode": mode, "nproc": nproc})
        assert httpx.post(f"{service}/api/v1/jobs", json=spec, timeout=60).status_code == 202
    return wait_for(lambda: finished()[:count] if len(finished()) >= count else None, JOB_TIMEOUT_S, "finished jobs")


# each row of the compare table: its classed cells' text (the mode without its plan) and whether it is the baseline
COMPARE_CELLS = """rows => rows.map(row => ({
    ...Object.fromEntries([...row.querySelectorAll('td[class]')].map(td => [td.className, td.innerText.trim()])),
    mode: row.querySelector('td.mode .mode-name').textContent,
    baseline: row.querySelector('th .tag') !== null,
}))"""


def test_compare_page_puts_jobs_side_by_side(browser: Any, service: str) -> None:
    ids = finished_jobs(service, 2)
    with watched_page(browser, service) as watched:
        page = watched.page
        page.goto(f"/compare?ids={ids[0]},{ids[1]}")
        wait_until_ready(watched)
        assert page.locator("#compare-rows tbody tr").evaluate_all("rows => rows.map(r => r.dataset.job)") == [
            str(i) for i in ids
        ]
        # each measured job has a speed-up over the baseline (itself 1.00), or is within noise of it (two tiny
        # jobs on a shared machine may well be); the mode is as submitted
        cells = page.locator("#compare-rows tbody tr").evaluate_all(COMPARE_CELLS)
        measured = [row for row in cells if row["rate"] != "—"]
        speedups = [row["speedup"] for row in measured]
        assert measured and all(re.fullmatch(r"×\d+\.\d\d|within noise", text) for text in speedups), cells
        assert [row["speedup"] for row in cells if row["baseline"]] == ["×1.00"], cells
        submitted = [api_job(service, job_id)["spec"]["schedule"]["mode"] for job_id in ids]
        assert [row["mode"].split(" → ")[0] for row in cells] == submitted, cells
        assert int(page.locator("#chart-compare-loss").get_attribute("data-points") or 0) > 0
        assert page.locator("#chart-compare-loss .u-legend").inner_text().count("#") == 2  # one named curve per job
        watched.screenshot("compare-1280")
        page.set_viewport_size(PHONE)
        page.wait_for_timeout(300)
        assert watched.overflow() == 0
        watched.screenshot("compare-390")
        assert watched.errors == []


def test_a_finetune_job_page_shows_its_accuracy_curves_and_micro_batch_schedule(browser: Any, service: str) -> None:
    from tests.ranks.test_finetune import e2e_document

    document = e2e_document("zb", 2, profile=True, max_steps=12, eval_every=1)
    job_id = httpx.post(f"{service}/api/v1/jobs", json=document, timeout=60).json()["id"]
    with watched_page(browser, service) as watched:
        page = watched.page
        page.goto(f"/jobs/{job_id}")
        wait_until_ready(watched)
        page.wait_for_selector("body[data-stream-ended='1']", timeout=JOB_TIMEOUT_S * 1000)
        assert api_job(service, job_id)["state"] == "succeeded"
        assert int(page.locator("#chart-ft-loss").get_attribute("data-points") or 0) >= 12  # a loss per step
        assert page.locator("#chart-ft-acc .u-legend", has_text="eval top-1").count() == 1
        assert page.locator("#chart-ft-acc .u-legend", has_text="train batch").count() == 1
        for view in ("predicted", "measured"):
            rows = page.locator(f"#ft-gantt-{view} g.gantt-row")
            assert rows.count() == 2
            for kind in ("F", "I", "W"):  # zb's split backward, micro-batch by micro-batch, on both stages
                assert page.locator(f"#ft-gantt-{view} g.gantt-row[data-rank='1'] rect.k-{kind}").count() >= 4
        assert page.locator("#finetune-strategies tbody tr").count() == 4
        # its layer profile, measured by this job: every layer, and the co-run curve (one rank alone is 1 by
        # definition; both ranks at once measured, not assumed: a ratio of two timings, its size the machine's)
        from pipebd_core.documents.layer_profile import LayerProfile

        measured = httpx.get(f"{service}/api/v1/jobs/{job_id}/artifacts/layer_profile.json", timeout=30).json()
        profile = LayerProfile.from_json(measured)
        assert len(profile.layers) == 11 and all(layer.microbatch.F.median > 0 for layer in profile.layers)
        alone, both = profile.co_run
        assert alone == 1.0 and both != 1.0 and 0.0 < both < math.inf
        assert page.locator("#finetune-strategies tr.chosen").get_attribute("data-strategy") == "zb"
        assert page.locator("#finetune-top1").inner_text().endswith("%")
        assert not page.locator("#part-plan").is_visible()  # a kind train job distils nothing
        assert [li.get_attribute("data-phase") for li in page.locator("#phase-timeline li").all()] == [
            "profile_finetune",
            "plan_finetune",
            "finetune",
            "evaluate",
        ]
        watched.screenshot("job-finetune-1280")
        page.set_viewport_size(PHONE)
        page.wait_for_timeout(300)
        assert watched.overflow() == 0
        assert watched.errors == []


def test_a_sweep_page_cancels_every_child_and_updates_in_place(browser: Any, service: str) -> None:
    body = {"spec": long_job(), "grid": {"train.lr": [0.01, 0.02]}, "max_parallel": 1}
    created = httpx.post(f"{service}/api/v1/sweeps", json=body, timeout=60)
    assert created.status_code == 202, created.text
    sweep = created.json()
    with watched_page(browser, service) as watched:
        page = watched.page
        page.on("dialog", lambda dialog: dialog.accept())
        page.goto(f"/sweeps/{sweep['id']}")
        wait_until_ready(watched)
        assert page.locator("#sweep-children tbody tr").count() == 2
        page.click("#cancel-sweep")
        page.wait_for_selector("#sweep-summary[data-state='cancelled']", timeout=60_000)
        assert page.evaluate("window.__sameDocument") is True
        assert page.locator("#sweep-children .badge").all_inner_texts() == ["⊘ cancelled", "⊘ cancelled"]
        assert page.locator("#cancel-sweep").count() == 0 and page.locator("#resume-sweep").count() == 1
        watched.screenshot("sweep-1280")
        page.set_viewport_size(PHONE)
        page.wait_for_timeout(300)
        assert watched.overflow() == 0
        watched.screenshot("sweep-390")
        assert watched.errors == []
