"""Service tier: the findings of issue 11, each as the test that would have caught it.

Ids past the database's integer range on every route, a large value echoed back, an unexpected
exception answered as plain text and unlogged, the server stalled by a large or slow spec, limits
that differ from docs/limits.md, and an API process holding torch: each runs against the real app (and,
where the event loop or the process matters, a real uvicorn or a real `pipebd api`).
"""

from __future__ import annotations

import base64
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.core.states import RUNNING
from app.main import create_app
from pipebd_core.job import agent_server
from pipebd_core.job.agent_server import SHARED_AGENTS
from tests.service.conftest import make_settings
from tests.service.exiting_data import EXIT_CODE
from tests.service.exiting_data import FACTORY as EXITING_DATA
from tests.service.factories import insert_job, tiny_job
from tests.service.live import pipebd_api, serve
from tests.service.slow_data import FACTORY as SLOW_DATA
from tests.service.workers import REPO, wait_for

JOBS = "/api/v1/jobs"
DB_INT_MAX = 2**31 - 1  # PostgreSQL's INTEGER, the type of job.id
HANG_S = 60.0  # a request (or a health check) not answered in this long hangs: no loaded machine takes that long


def job_routes(client: TestClient) -> list[tuple[str, str]]:
    """Every (method, path template) of the schema under /jobs/{job_id}, so a route added later is checked too."""
    paths = client.get("/openapi.json").json()["paths"]
    return [(method, path) for path, item in paths.items() if "{job_id}" in path for method in item]


def test_ids_past_the_integer_range_are_422_on_every_job_route(client: TestClient) -> None:
    routes = job_routes(client)
    assert len(routes) >= 9  # read, cancel, delete, plan, metrics, logs, artifacts, an artifact, events
    for method, template in routes:
        for job_id in (DB_INT_MAX + 1, 2**63, 10**30):
            answer = client.request(method, template.format(job_id=job_id, name="plan.json"))
            assert answer.status_code == 422, (method, template, job_id, answer.text)
            assert answer.json()["errors"][0]["loc"] == ["path", "job_id"], (method, template)
        missing = client.request(method, template.format(job_id=DB_INT_MAX, name="plan.json"))
        assert missing.status_code == 404 and "does not exist" in missing.json()["detail"], (method, template)


def test_dashboard_pages_refuse_such_ids_too(client: TestClient) -> None:
    for path in (f"/jobs/{2**63}", f"/jobs/{2**63}/partials/status", f"/jobs/{10**30}"):
        page = client.get(path)
        assert page.status_code == 422 and "less than or equal to 2147483647" in page.text, path
    compare = client.get("/compare", params={"ids": f"1,{2**63}"})
    assert compare.status_code == 422 and "is not a job id" in compare.text
    cursor = base64.urlsafe_b64encode(f"job:{2**63}".encode()).decode().rstrip("=")
    listing = client.get("/", params={"cursor": cursor})
    assert listing.status_code == 422 and "was not returned by this API" in listing.text
    api_listing = client.get(JOBS, params={"cursor": cursor})
    assert api_listing.status_code == 422 and api_listing.json()["errors"][0]["loc"] == ["query", "cursor"]


def test_a_large_value_comes_back_as_an_excerpt(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", max_body_bytes=32 << 20)
    client = TestClient(create_app(settings))
    answer = client.post(JOBS, json={**tiny_job(), "note": "x" * 20_000_000})  # a field the spec does not have
    assert answer.status_code == 422 and len(answer.content) < 4096
    (item,) = answer.json()["errors"]
    assert item["loc"] == ["body", "note"] and item["value"].startswith("x" * 120)
    assert item["value"].endswith(f"... ({20_000_000 - 120} more characters)")


def test_an_unexpected_exception_is_a_problem_logged_once_under_its_id(
    client: TestClient, settings: Settings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "plan.json").write_text('{"mode": "tr", ')  # a run directory damaged on disk
    job = insert_job(settings, state=RUNNING, run_dir=str(run))
    with caplog.at_level(logging.ERROR, logger="pipebd.api"):
        answer = client.get(f"{JOBS}/{job.id}/plan")
    assert answer.status_code == 500 and answer.headers["content-type"] == "application/problem+json"
    request_id = answer.headers["x-request-id"]
    problem = answer.json()
    assert problem["request_id"] == request_id and request_id in problem["detail"]
    logged = [record for record in caplog.records if request_id in record.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None
    assert f"GET {JOBS}/{job.id}/plan failed: JSONDecodeError" in logged[0].getMessage()
    assert client.get(f"{JOBS}/{job.id}").status_code == 200  # the server goes on


@dataclass
class InFlight:
    """One request sent from a thread of its own: its answer's status once it came, and whether it still waits."""

    thread: threading.Thread
    status: list[int] = field(default_factory=list)

    @property
    def waiting(self) -> bool:
        return self.thread.is_alive()


def post_in_thread(url: str, content: Any, content_type: str) -> InFlight:
    """POST `content` (bytes, or an iterator of chunks: a streamed upload) without waiting for the answer."""
    status: list[int] = []

    def send() -> None:
        try:
            headers = {"Content-Type": content_type}
            status.append(httpx.post(f"{url}{JOBS}", content=content, headers=headers, timeout=120).status_code)
        except httpx.TransportError:  # the server closed the upload it refused before it was all sent
            status.append(-1)

    thread = threading.Thread(target=send)
    thread.start()
    return InFlight(thread, status)


def healthy_while(url: str, request: InFlight, answered: threading.Event | None = None) -> int:
    """Health checks, one after another, until `request` has its answer: how many were answered while it still
    waited. Each answer sets `answered` (an upload that waits for it goes on only once the loop answered)."""
    count = 0
    while request.waiting:
        assert httpx.get(f"{url}/healthz", timeout=HANG_S).status_code == 200
        if request.waiting:
            count += 1
            if answered is not None:
                answered.set()
        time.sleep(0.05)
    request.thread.join()
    return count


def trickled(body: bytes, answered: threading.Event, chunk: int = 256 << 10) -> Iterator[bytes]:
    """`body` as a streamed upload (no Content-Length) that stops after its first chunk until a health check
    has been answered: the server holds a half-received upload while the health check runs."""
    yield body[:chunk]
    answered.wait(HANG_S)  # a health check that never comes back: the upload goes on, and the test fails below
    for start in range(chunk, len(body), chunk):
        yield body[start : start + chunk]


def yaml_named(name: str) -> bytes:
    """A tiny job's YAML with `name` spliced in (PyYAML's emitter takes seconds per megabyte of one string)."""
    return yaml.safe_dump({**tiny_job(), "name": "NAME"}).replace("NAME", name).encode()


def test_health_answers_while_large_and_slow_specs_are_refused(tmp_path: Path) -> None:
    """The API runs as its own process, as it does in production: the test's client threads (one of them
    uploading 20 MB) would otherwise share the server's interpreter lock. Neither a large upload nor a spec
    whose check runs into its time bound holds up the event loop: health checks are answered while each of
    them is still in flight (ordering, not speed: a loop blocked behind either answers none in that window)."""
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}")
    slow = tiny_job(data={"dataset": "custom", "factory": SLOW_DATA, "options": {"delay_s": 120}})
    allow = "pipebd_core.workloads,tests.service.slow_data"
    with pipebd_api(settings, PIPEBD_SPEC_CHECK_TIMEOUT_S="4.0", PIPEBD_FACTORY_ALLOWLIST=allow) as api:
        url = api.url
        httpx.post(f"{url}{JOBS}", json=tiny_job(), timeout=120)  # the spec checker is up
        answered = threading.Event()
        upload = post_in_thread(url, trickled(yaml_named("x" * 20_000_000), answered), "application/yaml")
        during_upload = healthy_while(url, upload, answered)
        declared = post_in_thread(url, yaml_named("x" * 20_000_000), "application/yaml")  # with Content-Length
        healthy_while(url, declared)
        medium = post_in_thread(url, yaml_named("y" * 1_000_000), "application/yaml")
        healthy_while(url, medium)
        started = time.monotonic()
        checking = post_in_thread(url, yaml.safe_dump(slow).encode(), "application/yaml")
        during_check = healthy_while(url, checking)
        check_s = time.monotonic() - started
    assert upload.status in ([413], [-1]) and during_upload >= 1  # refused once past the limit, never parsed
    assert declared.status == [413]
    assert medium.status == [422]  # read, parsed and refused (the name's pattern)
    # refused at its 4 s bound, not after its data's 120 s; health answered all along (a few at the least)
    assert checking.status == [422] and 4.0 <= check_s < HANG_S, check_s
    assert during_check >= 5, during_check


def test_a_spec_that_kills_the_checker_is_refused_and_the_next_one_checked(tmp_path: Path) -> None:
    allow = "pipebd_core.workloads,tests.service.exiting_data"
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}", factory_allowlist=allow)
    client = TestClient(create_app(settings))
    killer = client.post(JOBS, json=tiny_job(data={"dataset": "custom", "factory": EXITING_DATA}))
    assert killer.status_code == 422
    assert f"ended the spec checker process (exit code {EXIT_CODE})" in killer.json()["detail"]
    assert client.post(JOBS, json=tiny_job()).status_code == 202  # on a new checker


def test_submissions_are_counted_per_token(tmp_path: Path) -> None:
    first, second = "first-token-0123456789abcdef", "second-token-0123456789abcdef"
    settings = make_settings(
        tmp_path,
        f"sqlite:///{tmp_path / 'db.sqlite'}",
        api_tokens=f"{first}=submit,{second}=submit",
        submissions_per_minute=2,
    )
    client = TestClient(create_app(settings))
    answers = [client.post(JOBS, json={}, headers={"Authorization": f"Bearer {first}"}) for _ in range(3)]
    assert [answer.status_code for answer in answers] == [422, 422, 429]
    assert 1 <= int(answers[2].headers["retry-after"]) <= 60
    assert "from this token" in answers[2].json()["detail"]
    assert client.post(JOBS, json={}, headers={"Authorization": f"Bearer {second}"}).status_code == 422


def documented_limits() -> dict[str, str]:
    """`PIPEBD_X` -> the default the limits table of docs/limits.md gives it."""
    section = (REPO / "docs" / "limits.md").read_text().split("\n## Limits\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {cells[0].strip(" `"): cells[1].strip() for cells in (row.strip("|").split("|") for row in rows)}


def test_the_documented_limits_are_the_settings() -> None:
    limits = documented_limits()
    assert len(limits) >= 10
    for variable, default in limits.items():
        name = variable.removeprefix("PIPEBD_").lower()
        assert str(Settings.model_fields[name].default) == default, variable


def loads_torch(pid: int) -> bool:
    return any("libtorch" in os.path.basename(mapping.path) for mapping in psutil.Process(pid).memory_maps())


def test_the_api_checks_specs_without_loading_torch(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}")
    # as deployed: no shared agent server named, so the helpers are the API's own children
    with pipebd_api(settings, PIPEBD_SPEC_CHECKER_IDLE_S="3", **{SHARED_AGENTS: ""}) as server:
        process, url, api = server.process, server.url, psutil.Process(server.process.pid)
        assert not loads_torch(process.pid) and api.children() == []
        refused = httpx.post(f"{url}{JOBS}", json=tiny_job(data={"image_size": 4}), timeout=120)
        assert refused.status_code == 422  # the engine's own model: no helper needed
        assert api.children() == []
        accepted = httpx.post(f"{url}{JOBS}", json=tiny_job(), timeout=120)
        assert accepted.status_code == 202, accepted.text
        (helper,) = api.children()
        assert loads_torch(helper.pid) and not loads_torch(process.pid)
        wait_for(lambda: not api.children(), 30, "the idle spec checker to exit")
        again = httpx.post(f"{url}{JOBS}", json=tiny_job(name="again"), timeout=120)  # a new helper starts
        assert again.status_code == 202 and not loads_torch(process.pid)


def test_where_a_shared_agent_server_is_named_it_forks_the_spec_checkers_and_reports_their_deaths(
    tmp_path: Path,
) -> None:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'db.sqlite'}")
    allow = "pipebd_core.workloads,tests.service.exiting_data"
    path = str(tmp_path / "agents.sock")
    shared = agent_server.share(path)
    assert shared.process is not None
    try:
        with pipebd_api(settings, PIPEBD_FACTORY_ALLOWLIST=allow, **{SHARED_AGENTS: path}) as server:
            api, forker = psutil.Process(server.process.pid), psutil.Process(shared.process.pid)
            accepted = httpx.post(f"{server.url}{JOBS}", json=tiny_job(), timeout=120)
            assert accepted.status_code == 202, accepted.text
            (helper,) = [child for child in forker.children() if "app.services.preflight" in child.cmdline()]
            assert api.children() == [] and loads_torch(helper.pid) and not loads_torch(api.pid)
            killer = httpx.post(
                f"{server.url}{JOBS}", json=tiny_job(data={"dataset": "custom", "factory": EXITING_DATA})
            )
            assert killer.status_code == 422  # the server reaped it and told the API its code
            assert f"ended the spec checker process (exit code {EXIT_CODE})" in killer.json()["detail"]
            again = httpx.post(f"{server.url}{JOBS}", json=tiny_job(name="again"), timeout=120)
            assert again.status_code == 202, again.text  # on a new helper, forked by the server too
            assert api.children() == []
    finally:
        shared.close()


def test_pipebd_submit_prints_each_problem(
    tmp_path: Path, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    from app.cli.main import main

    spec = tmp_path / "bad.yaml"
    spec.write_text(yaml.safe_dump(tiny_job(train={"epochs": "many"}, data={"bogus": 1})))
    with serve(create_app(settings)) as url:
        assert main(["submit", str(spec), "--server", url]) == 2
    error = capsys.readouterr().err
    assert error.startswith("pipebd: error: HTTP 422: ")
    assert "data.bogus: not a field here" in error and "train.epochs: Input should be a valid integer" in error
