"""Browser tier: the page of a failed job says why it ended, shows the failing rank's traceback and
that rank's log. Real Chromium against the real app (uvicorn) reading a run directory as a worker
leaves it; no job runs here (the worker's diagnosis of real failures is tested in tests/service)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.main import create_app
from tests.service.conftest import make_settings
from tests.service.factories import insert_job
from tests.service.live import serve
from tests.web.browser import PHONE, watched_page

TRACEBACK = (
    "rank 1 failed: ValueError: bad block\n"
    "Traceback (most recent call last):\n"
    '  File "x.py", line 3\n'
    "ValueError: bad block"
)


@pytest.fixture(scope="module")
def failed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    folder: Path = tmp_path_factory.mktemp("failed")
    settings = make_settings(folder, f"sqlite:///{folder / 'pipebd.db'}")
    app = create_app(settings)
    run = folder / "run"
    (run / "logs" / "distill").mkdir(parents=True)
    (run / "logs" / "distill" / "rank-0.log").write_text("rank 0 started\n")
    (run / "logs" / "distill" / "rank-1.log").write_text("rank 1 started\n" + TRACEBACK + "\n")
    (run / "events.jsonl").write_text(json.dumps({"time": time.time(), "event": "rank_error", "rank": 1}) + "\n")
    job = insert_job(
        settings,
        "failed",
        started_at=time.time() - 9,
        finished_at=time.time(),
        run_dir=str(run),
        termination_reason="rank_error",
        error=TRACEBACK,
        exit_code=1,
    )
    assert job.id is not None
    with serve(app) as url:
        yield url, job.id


def test_a_failed_job_shows_its_reason_traceback_and_rank_log(browser: Any, failed: tuple[str, int]) -> None:
    url, job_id = failed
    with watched_page(browser, url) as watched:
        page = watched.page
        page.goto(f"/jobs/{job_id}")
        page.wait_for_selector("body[data-stream-ended='1']")
        termination = page.locator("#termination")
        assert "Ended: rank_error" in termination.inner_text()
        assert "A rank raised an exception" in termination.inner_text()
        assert page.locator("#termination pre.traceback").inner_text() == TRACEBACK
        assert page.locator("#log-text").inner_text().strip() == "rank 0 started"
        page.select_option("#log-source", "1")  # the failing rank's own output
        page.wait_for_function("document.getElementById('log-text').textContent.includes('ValueError: bad block')")
        assert "rank_error" in page.locator("#engine-events").inner_text()
        assert page.locator("#bottleneck-statement").inner_text().startswith("No telemetry: the job ended")
        assert "No plan: the job ended" in page.locator("#gantt-predicted").inner_text()
        assert page.locator("[data-cancel]").count() == 0
        watched.screenshot("job-failed-1280")
        page.set_viewport_size(PHONE)
        assert watched.overflow() == 0
        watched.screenshot("job-failed-390")
        assert watched.errors == []
