"""Service tier: bad submissions get a clear 4xx naming what is wrong, and nothing is stored or enqueued.

Runs the real app on SQLite and PostgreSQL with a real SQLite broker; after every refusal the job,
event tables and the broker's queues are checked to be empty.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.core.tables import Job, JobEvent
from app.main import create_app
from tests.service.conftest import make_settings
from tests.service.factories import broker_messages, count_rows, tiny_job

JOBS = "/api/v1/jobs"
TOKEN = "submit-token-0123456789abcdef"


def assert_nothing_stored(settings: Settings) -> None:
    assert count_rows(settings, Job) == 0
    assert count_rows(settings, JobEvent) == 0
    assert broker_messages(settings) == 0
    assert not any(settings.runs.iterdir())


def messages(response: Any) -> str:
    detail = response.json()["detail"]
    return "\n".join(item["msg"] for item in detail) if isinstance(detail, list) else detail


BODY_CASES = [
    ('{"name": "x", ', "application/json", 400, "malformed JSON at line 1 column 15: Expecting property name"),
    ("name: [unclosed", "application/yaml", 400, "malformed YAML"),
    ("[1, 2]", "application/json", 400, "a spec must be a JSON/YAML object of sections, got list"),
    (
        "name: x",
        "text/plain",
        415,
        "Content-Type 'text/plain' is not accepted; send the spec as one of: application/json",
    ),
]


@pytest.mark.parametrize(("body", "content_type", "status", "expected"), BODY_CASES)
def test_unreadable_bodies(
    client: TestClient, settings: Settings, body: str, content_type: str, status: int, expected: str
) -> None:
    response = client.post(JOBS, content=body, headers={"Content-Type": content_type})
    assert response.status_code == status
    assert expected in response.json()["detail"]
    assert_nothing_stored(settings)


def with_changes(**sections: dict[str, Any]) -> dict[str, Any]:
    document = tiny_job()
    for section, values in sections.items():
        document[section] = {**document.get(section, {}), **values}
    return document


SPEC_CASES = [
    ({**tiny_job(), "extra": 1}, ["extra"], "extra: Extra inputs are not permitted"),
    (with_changes(train={"epochs": "many"}), ["train", "epochs"], "train.epochs: Input should be a valid integer"),
    (with_changes(schedule={"mode": "fast"}), ["schedule", "mode"], "schedule.mode: Input should be 'dp', 'ls'"),
    (
        with_changes(data={"dataset": "cifar10", "root": "/etc"}),
        ["data", "root"],
        "data.root: '/etc' is outside the data roots",
    ),
    (
        with_changes(workload={"teacher_weights": "/root/w.pt"}),
        ["workload", "teacher_weights"],
        "outside the data roots",
    ),
    (
        with_changes(workload={"factory": "os:system"}),
        ["workload", "factory"],
        "workload.factory: module 'os' is not in this server's factory allowlist; allowed: pipebd_core.workloads",
    ),
    (
        with_changes(data={"dataset": "custom", "factory": "pipebd_core.workloadsevil:make"}),
        ["data", "factory"],
        "data.factory: module 'pipebd_core.workloadsevil' is not in this server's factory allowlist",
    ),
    (
        with_changes(schedule={"mode": "hybrid", "stages": [{"start": 0, "stop": 2, "replicas": 1}]}),
        ["schedule"],
        "the last stage stops at block 2 but the workload has 4 blocks",
    ),
    (with_changes(workload={"options": {"bogus": 1}}), ["workload", "options"], "does not accept ['bogus']"),
]


@pytest.mark.parametrize(("document", "loc", "expected"), SPEC_CASES)
def test_invalid_specs_name_the_field(
    client: TestClient, settings: Settings, document: dict[str, Any], loc: list[str], expected: str
) -> None:
    response = client.post(JOBS, json=document)
    assert response.status_code == 422
    assert expected in messages(response)
    assert response.json()["detail"][0]["loc"] == ["body", *loc]
    assert_nothing_stored(settings)


def test_data_under_a_root_passes_the_path_check(tmp_path: Path, client: TestClient, settings: Settings) -> None:
    root = settings.roots[0] / "cifar"
    response = client.post(JOBS, json=with_changes(data={"dataset": "cifar10", "root": str(root)}))
    # past the policy: the engine's own check now says the data is missing, naming the path
    assert response.status_code == 422 and "outside the data roots" not in messages(response)
    assert str(root) in messages(response)
    assert_nothing_stored(settings)


@pytest.fixture
def secured(tmp_path: Path, database_url: str) -> tuple[TestClient, Settings]:
    settings = make_settings(tmp_path, database_url, api_tokens=f"{TOKEN}=submit,reader-token-0123456789abc=read")
    return TestClient(create_app(settings)), settings


def test_missing_or_wrong_tokens_store_nothing(secured: tuple[TestClient, Settings]) -> None:
    client, settings = secured
    missing = client.post(JOBS, json=tiny_job())
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert "missing bearer token" in missing.json()["detail"]
    unknown = client.post(JOBS, json=tiny_job(), headers={"Authorization": "Bearer not-a-known-token-at-all"})
    assert unknown.status_code == 401 and unknown.json()["detail"] == "unknown bearer token"
    reader = client.post(JOBS, json=tiny_job(), headers={"Authorization": "Bearer reader-token-0123456789abc"})
    assert reader.status_code == 403 and "needs a 'submit' token" in reader.json()["detail"]
    assert_nothing_stored(settings)
