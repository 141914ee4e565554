"""Service tier: bearer tokens and scopes on every route, and the refusal to serve an open API publicly."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.api.auth import check_bind
from app.cli.main import main
from app.core.settings import Settings
from app.main import create_app
from tests.service.conftest import make_settings
from tests.service.factories import tiny_job

SUBMIT = "submit-token-0123456789abcdef"
READ = "reader-token-0123456789abcdef"
OTHER = "another-submit-token-0123456789"  # a second tenant


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    tokens = f"{SUBMIT}=submit,{READ}=read,{OTHER}=submit"
    return TestClient(create_app(make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", api_tokens=tokens)))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


# Routes without a token: /healthz (documented as open) and the login form itself; /static (vendored
# public assets) is a mount, not a route.
OPEN_ROUTES = {("GET", "/healthz")}
DOCS = ("/docs", "/docs/oauth2-redirect", "/redoc")


def test_every_route_but_health_needs_a_token(client: TestClient) -> None:
    job_id = client.post("/api/v1/jobs", json=tiny_job(), headers=bearer(SUBMIT)).json()["id"]
    schema = client.get("/openapi.json", headers=bearer(READ)).json()
    # every API route the schema documents, so a route added later is checked too
    routes = [
        (method.upper(), path.format(job_id=job_id, name="plan.json", webhook_id=1, sweep_id=1, model_id=1))
        for path, item in schema["paths"].items()
        for method in item
        if (method.upper(), path) not in OPEN_ROUTES
    ]
    assert len(routes) >= 12 and ("GET", f"/api/v1/jobs/{job_id}/events") in routes
    for method, path in [*routes, ("GET", "/openapi.json")]:
        answer = client.request(method, path)
        assert answer.status_code == 401, (method, path, answer.status_code)
        assert answer.headers["www-authenticate"] == "Bearer", (method, path)
    for page in ("/", f"/jobs/{job_id}", "/jobs/new", "/compare", *DOCS):  # the dashboard asks for the token instead
        answer = client.get(page, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login?next="), page
    assert client.get("/docs", follow_redirects=False).headers["location"] == "/login?next=/docs"
    assert client.get("/openapi.json", headers=bearer("unknown-token-0123456789abcdef")).status_code == 401
    assert client.get("/healthz").status_code == 200
    assert client.get(f"/api/v1/jobs/{job_id}", headers=bearer(READ)).json()["state"] == "queued"  # nothing changed it


def test_docs_take_the_read_scope_by_header_or_dashboard_cookie(client: TestClient) -> None:
    assert "/api/v1/jobs" in client.get("/openapi.json", headers=bearer(READ)).json()["paths"]
    assert client.get("/openapi.json", cookies={"pipebd_token": READ}).status_code == 200  # what /docs fetches
    for page in DOCS:
        answer = client.get(page, cookies={"pipebd_token": READ}, follow_redirects=False)
        assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html"), page
    assert "url: '/openapi.json'" in client.get("/docs", cookies={"pipebd_token": READ}).text
    assert "/openapi.json" in client.get("/redoc", headers=bearer(SUBMIT)).text


def test_docs_stay_open_without_tokens(tmp_path: Path) -> None:
    open_client = TestClient(create_app(make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}")))
    assert "/api/v1/jobs" in open_client.get("/openapi.json").json()["paths"]
    for page in DOCS:
        assert open_client.get(page, follow_redirects=False).status_code == 200, page


def test_read_scope_reads_and_submit_scope_does_everything(client: TestClient) -> None:
    job_id = client.post("/api/v1/jobs", json=tiny_job(), headers=bearer(SUBMIT)).json()["id"]
    assert client.get(f"/api/v1/jobs/{job_id}", headers=bearer(READ)).status_code == 200
    assert client.get("/api/v1/jobs", cookies={"pipebd_token": READ}).status_code == 200
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=bearer(READ)).status_code == 403
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=bearer(SUBMIT)).json()["state"] == "cancelled"
    assert client.delete(f"/api/v1/jobs/{job_id}", headers=bearer(READ)).status_code == 403
    assert client.delete(f"/api/v1/jobs/{job_id}", headers=bearer(SUBMIT)).status_code == 204


def test_a_token_s_webhook_hears_only_the_jobs_submitted_with_that_token(client: TestClient) -> None:
    hook = {"url": "http://127.0.0.1:9/hook", "events": ["job.queued"], "secret": "0123456789abcdef", "scope": "token"}
    assert client.post("/api/v1/webhooks", json=hook, headers=bearer(READ)).status_code == 403
    created = client.post("/api/v1/webhooks", json=hook, headers=bearer(SUBMIT))
    assert created.status_code == 201 and created.json()["scope"] == "token"
    mine = client.post("/api/v1/jobs", json=tiny_job("mine"), headers=bearer(SUBMIT)).json()["id"]
    client.post("/api/v1/jobs", json=tiny_job("theirs"), headers=bearer(OTHER))
    log = client.get(f"/api/v1/webhooks/{created.json()['id']}/deliveries", headers=bearer(READ)).json()["data"]
    assert [(entry["event"], entry["job_id"]) for entry in log] == [("job.queued", mine)]


def test_tokens_must_be_real_secrets() -> None:
    with pytest.raises(ValueError, match="at least 16 random characters"):
        Settings(api_tokens="changeme=submit")
    with pytest.raises(ValueError, match="scope must be 'read' or 'submit'"):
        Settings(api_tokens=f"{SUBMIT}=admin")


def test_no_open_api_beyond_loopback(tmp_path: Path) -> None:
    open_settings = Settings(data_dir=tmp_path)
    for host in ("127.0.0.1", "localhost", "::1"):
        check_bind(host, open_settings, insecure=False)
    with pytest.raises(ValueError, match=r"refusing to listen on 0\.0\.0\.0 without authentication"):
        check_bind("0.0.0.0", open_settings, insecure=False)
    check_bind("0.0.0.0", open_settings, insecure=True)
    check_bind("0.0.0.0", Settings(data_dir=tmp_path, api_tokens=f"{SUBMIT}=submit"), insecure=False)


def test_cli_refuses_before_serving(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PIPEBD_API_TOKENS", raising=False)
    assert main(["api", "--host", "0.0.0.0", "--data-dir", str(tmp_path)]) == 2
    assert "refusing to listen on 0.0.0.0" in capsys.readouterr().err
    assert not (tmp_path / "pipebd.db").exists()
