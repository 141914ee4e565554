"""Browser tier: the API documentation pages (/docs, /redoc) render in Chromium from the vendored
Swagger UI and Redoc with every request off the machine refused, as on an air-gapped node.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from app.main import create_app
from tests.service.conftest import make_settings
from tests.service.live import serve
from tests.web.browser import watched_page

pytestmark = pytest.mark.timeout(120)
# Redoc 2's side menu ends with "API docs by Redocly" and that company's logo from its CDN; the
# image hides itself when it does not load, which is all it does offline
REDOCLY_LOGO = "https://cdn.redoc.ly/redoc/logo-mini.svg"
# what Chromium writes to the console when a request is refused (the logo above)
REFUSED = "Failed to load resource: net::ERR_FAILED"


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder: Path = tmp_path_factory.mktemp("docs")
    with serve(create_app(make_settings(folder, f"sqlite:///{folder / 'pipebd.db'}"))) as url:
        yield url


def offline(page: Any, base_url: str) -> list[str]:
    """Refuses every request that leaves the service; the list of those refused, as they happen."""
    refused: list[str] = []
    local = urlsplit(base_url).netloc

    def route(request_route: Any) -> None:
        url = request_route.request.url
        if urlsplit(url).netloc == local:
            request_route.continue_()
        else:
            refused.append(url)
            request_route.abort()

    page.route("**/*", route)
    return refused


def test_swagger_ui_renders_the_schema_offline(browser: Any, service: str) -> None:
    with watched_page(browser, service) as watched:
        refused = offline(watched.page, service)
        watched.page.goto("/docs")
        title = watched.page.locator(".swagger-ui .info .title")
        title.wait_for(state="visible")
        assert "PipeBD" in title.inner_text()
        watched.page.locator(".swagger-ui .opblock-summary-path", has_text="/api/v1/jobs").first.wait_for()
        assert refused == [] and watched.errors == []


def test_redoc_renders_the_schema_offline(browser: Any, service: str) -> None:
    with watched_page(browser, service) as watched:
        refused = offline(watched.page, service)
        watched.page.goto("/redoc")
        heading = watched.page.locator(".api-info h1")
        heading.wait_for(state="visible")
        assert "PipeBD" in heading.inner_text()
        watched.page.locator('[data-section-id="operation/submit_job_api_v1_jobs_post"]').wait_for(state="attached")
        assert set(refused) <= {REDOCLY_LOGO}
        assert [error for error in watched.errors if error != REFUSED or not refused] == []
