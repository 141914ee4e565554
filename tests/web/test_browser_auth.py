"""Browser tier: with tokens configured, the dashboard asks for a token once, keeps it in an
HTTP-only cookie, and a read-only token sees no submit or cancel controls; the login page (with and
without its error) and the new-job page fit a 390 px phone screen. Real Chromium against the real app
served by uvicorn; no worker is needed (no job runs here)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.main import create_app
from tests.service.conftest import make_settings
from tests.service.factories import insert_job
from tests.service.live import serve
from tests.web.browser import DESKTOP, NETWORK_ERROR, PHONE, watched_page

SUBMIT_TOKEN = "submit-token-0123456789abcdef"
READ_TOKEN = "read-token-0123456789abcdef"


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    folder: Path = tmp_path_factory.mktemp("secured")
    settings = make_settings(
        folder,
        f"sqlite:///{folder / 'pipebd.db'}",
        api_tokens=f"{SUBMIT_TOKEN}=submit,{READ_TOKEN}=read",
        stale_after_s=3600,  # the reaper leaves the running job (no worker here) alone
    )
    app = create_app(settings)
    job = insert_job(settings, "running", started_at=time.time())
    assert job.id is not None
    with serve(app) as url:
        yield url, job.id


def log_in(page: Any, token: str) -> None:
    page.fill("#token", token)
    page.keyboard.press("Enter")


def test_the_token_is_asked_once_and_kept_in_a_cookie(browser: Any, secured: tuple[str, int]) -> None:
    url, job_id = secured
    with watched_page(browser, url) as watched:
        page = watched.page
        page.goto(f"/jobs/{job_id}")
        assert page.url.endswith(f"/login?next=/jobs/{job_id}")
        watched.screenshot("login")
        page.set_viewport_size(PHONE)
        assert watched.overflow() == 0  # nothing to scroll sideways on a phone
        watched.screenshot("login-390")
        page.set_viewport_size(DESKTOP)
        log_in(page, SUBMIT_TOKEN)
        page.wait_for_url(f"{url}/jobs/{job_id}")
        page.wait_for_selector("body[data-ready='1']")
        assert page.locator(f"#cancel-{job_id}").is_visible()
        cookies = {cookie["name"]: cookie for cookie in page.context.cookies()}
        assert cookies["pipebd_token"]["value"] == SUBMIT_TOKEN and cookies["pipebd_token"]["httpOnly"] is True
        page.goto("/")  # no second question
        page.wait_for_selector("body[data-ready='1']")
        assert page.locator(f"#cancel-{job_id}").count() == 1 and page.locator("nav a", has_text="New job").count() == 1
        page.goto("/jobs/new")
        page.wait_for_selector("body[data-ready='1']")
        page.set_viewport_size(PHONE)
        page.wait_for_timeout(300)
        assert watched.overflow() == 0
        watched.screenshot("new-job-390")
        assert watched.errors == []


def test_a_read_only_token_sees_no_submit_or_cancel_controls(browser: Any, secured: tuple[str, int]) -> None:
    url, job_id = secured
    with watched_page(browser, url) as watched:
        page = watched.page
        page.goto("/")
        log_in(page, "a-token-this-server-never-heard-of")
        assert "does not know that token" in page.locator("#token-error").inner_text()
        assert page.locator("#token").get_attribute("aria-invalid") == "true"
        page.set_viewport_size(PHONE)
        assert watched.overflow() == 0  # the message wraps under the field
        watched.screenshot("login-error-390")
        page.set_viewport_size(DESKTOP)
        # the only console line so far is the browser's own report of the refused token's 401 answer
        assert [error.split(" (")[0] for error in watched.errors] == [NETWORK_ERROR.format(status=401)]
        watched.errors.clear()
        log_in(page, READ_TOKEN)
        page.wait_for_url(f"{url}/")
        page.wait_for_selector("body[data-ready='1']")
        assert page.locator("[data-cancel]").count() == 0
        assert page.locator("a", has_text="New job").count() == 0
        assert "read-only token" in page.locator(".who").inner_text()
        page.goto(f"/jobs/{job_id}")
        page.wait_for_selector("body[data-ready='1']")
        assert page.locator("[data-cancel]").count() == 0
        page.set_viewport_size(PHONE)
        assert watched.overflow() == 0
        watched.screenshot("job-read-only-390")
        refused = page.request.get(f"{url}/jobs/new")
        assert refused.status == 403 and "Read-only token" in refused.text()
        assert watched.errors == []
