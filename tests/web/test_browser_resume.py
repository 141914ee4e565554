"""Browser tier: the page of a job that was lost and failed lists its attempts and offers Resume; Resume
puts it back in the queue (the page follows it again), Pause keeps it out of the queue, and a refused
action says why. Real Chromium against the real app (uvicorn) and its SQLite broker; no job runs here
(tests/chaos runs resumed jobs)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session

from app.core.database import get_engine
from app.core.tables import JobAttempt
from app.main import create_app
from pipebd_core.rundir import RunDir
from tests.service.conftest import make_settings
from tests.service.factories import broker_messages, insert_job
from tests.service.live import serve
from tests.web.browser import watched_page


@pytest.fixture(scope="module")
def lost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, Any]]:
    folder: Path = tmp_path_factory.mktemp("resume")
    settings = make_settings(folder, f"sqlite:///{folder / 'pipebd.db'}")
    app = create_app(settings)
    run = folder / "run"
    RunDir(run).save_phases([])
    started = time.time() - 60
    job = insert_job(
        settings,
        "failed",
        started_at=started,
        finished_at=time.time(),
        run_dir=str(run),
        worker="w1",
        termination_reason="worker_lost",
        error="the worker w1 (pid 1 on this host) died while the job was running (phase distill)",
        restarts=2,
    )
    assert job.id is not None
    with Session(get_engine(settings.database)) as session:
        session.add(
            JobAttempt(
                job_id=job.id,
                number=1,
                worker="w1",
                started_at=started,
                ended_at=started + 20,
                outcome="requeued",
                reason="worker_lost",
                resumed_from=None,
            )
        )
        session.add(
            JobAttempt(
                job_id=job.id,
                number=2,
                worker="w2",
                started_at=started + 21,
                ended_at=started + 50,
                outcome="failed",
                reason="worker_lost",
                resumed_from=[8, 8, 8, 8],
            )
        )
        session.commit()
    with serve(app) as url:
        yield url, job.id, settings


def test_a_lost_job_lists_its_attempts_and_resumes_then_pauses_from_the_page(
    browser: Any, lost: tuple[str, int, Any]
) -> None:
    url, job_id, settings = lost
    with watched_page(browser, url) as watched:
        page = watched.page
        page.goto(f"/jobs/{job_id}")
        page.wait_for_selector("body[data-stream-ended='1']")
        rows = page.locator("#attempts tbody tr")
        assert rows.count() == 2
        assert "requeued" in rows.nth(0).inner_text() and "worker_lost" in rows.nth(0).inner_text()
        assert "w2" in rows.nth(1).inner_text() and "8, 8, 8, 8" in rows.nth(1).inner_text()
        assert page.locator(f"#pause-{job_id}").count() == 0
        messages = broker_messages(settings)
        page.click(f"#resume-{job_id}")
        page.wait_for_selector("#status[data-state='queued']")  # the page reloaded and follows the job again
        assert broker_messages(settings) == messages + 1
        assert "Why it waits" in page.locator("#status").inner_text()
        page.click(f"#pause-{job_id}")
        page.wait_for_selector("#status[data-state='paused']")
        assert page.locator(f"#resume-{job_id}").count() == 1 and page.locator(f"#pause-{job_id}").count() == 0
        watched.screenshot("job-paused-1280")
        assert watched.errors == []
