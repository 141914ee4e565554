"""Service tier: bearer tokens and scopes on every route, and the refusal to serve an open API publicly."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.auth import check_bind
from app.cli import main
from app.config import Settings
from app.main import create_app
from tests.service.conftest import make_settings
from tests.service.factories import tiny_job

SUBMIT = "submit-token-0123456789abcdef"
READ = "reader-token-0123456789abcdef"


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", api_tokens=f"{SUBMIT}=submit,{READ}=read")
    return TestClient(create_app(settings))


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_every_route_but_health_needs_a_token(client: TestClient) -> None:
    job_id = client.post("/api/v1/jobs", json=tiny_job(), headers=bearer(SUBMIT)).json()["id"]
    for path in (
        "/metrics",
        "/api/v1/jobs",
        f"/api/v1/jobs/{job_id}",
        f"/api/v1/jobs/{job_id}/metrics",
        f"/api/v1/jobs/{job_id}/logs",
        f"/api/v1/jobs/{job_id}/artifacts",
        f"/api/v1/jobs/{job_id}/events",
    ):
        assert client.get(path).status_code == 401, path
    for page in ("/", f"/jobs/{job_id}", "/jobs/new", "/compare"):  # the dashboard asks for the token instead
        answer = client.get(page, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"].startswith("/login?next="), page
    assert client.get("/healthz").status_code == 200


def test_read_scope_reads_and_submit_scope_does_everything(client: TestClient) -> None:
    job_id = client.post("/api/v1/jobs", json=tiny_job(), headers=bearer(SUBMIT)).json()["id"]
    assert client.get(f"/api/v1/jobs/{job_id}", headers=bearer(READ)).status_code == 200
    assert client.get("/api/v1/jobs", cookies={"pipebd_token": READ}).status_code == 200
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=bearer(READ)).status_code == 403
    assert client.post(f"/api/v1/jobs/{job_id}/cancel", headers=bearer(SUBMIT)).json()["state"] == "cancelled"
    assert client.delete(f"/api/v1/jobs/{job_id}", headers=bearer(READ)).status_code == 403
    assert client.delete(f"/api/v1/jobs/{job_id}", headers=bearer(SUBMIT)).status_code == 204


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
