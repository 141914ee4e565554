"""Service tier: the bad-input table of docs/limits.md, row by row, and nothing stored after any refusal.

Each row of `CASES` is a row of docs/limits.md's "Bad input" table (`test_the_documented_table_is_this_table`
keeps the two equal): one class of bad input, the request that sends it and the status it gets. Each
runs against the real app on SQLite and PostgreSQL with a real SQLite broker and one queued job in the
database; every answer must be a problem body (application/problem+json) of that status, bounded in
size, with the request's id, saying what is wrong; and afterwards only that one job exists, with no
message in the broker and no run directory.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.core.tables import Job, JobEvent
from app.main import create_app
from tests.service.conftest import make_settings
from tests.service.factories import broker_messages, count_rows, insert_job, tiny_job
from tests.service.slow_data import FACTORY as SLOW_DATA
from tests.service.workers import REPO

JOBS = "/api/v1/jobs"
SUBMIT = "submit-token-0123456789abcdef"
READ = "reader-token-0123456789abcdef"
TOKENS = {"api_tokens": f"{SUBMIT}=submit,{READ}=read"}
ANSWER_MAX_BYTES = 8192  # every refusal is small, however large the request


def problem_text(problem: dict[str, Any]) -> str:
    """The detail and every field problem's location and message, for `in` checks."""
    items = [f"{'.'.join(map(str, item['loc']))}: {item['message']}" for item in problem["errors"]]
    return "\n".join([problem["detail"], *items])


def with_changes(**sections: dict[str, Any]) -> dict[str, Any]:
    document = tiny_job()
    for section, values in sections.items():
        document[section] = {**document.get(section, {}), **values}
    return document


def post(body: str | bytes, content_type: str = "application/json") -> Callable[[TestClient, int], httpx.Response]:
    return lambda client, _: client.post(JOBS, content=body, headers={"Content-Type": content_type})


def post_json(document: dict[str, Any], **headers: str) -> Callable[[TestClient, int], httpx.Response]:
    return lambda client, _: client.post(JOBS, json=document, headers=headers)


def get(path: str, **headers: str) -> Callable[[TestClient, int], httpx.Response]:
    """GET `path`, with `{job}` replaced by the id of the job in the database."""
    return lambda client, job_id: client.get(path.format(job=job_id), headers=headers)


def streamed(size: int) -> Iterator[bytes]:
    """A body sent in chunks without Content-Length."""
    sent = 0
    while sent < size:
        yield b" " * 65536
        sent += 65536


def twice(client: TestClient, _: int) -> httpx.Response:
    client.post(JOBS, json={})  # refused, and counted all the same
    return client.post(JOBS, json=tiny_job())


ALIAS_BOMB = "\n".join(
    ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    + [f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]" for prev, name in zip("abc", "bcd", strict=True)]
)


@dataclass(frozen=True)
class BadInput:
    row: str  # the words of the documented table (docs/limits.md)
    status: int
    send: Callable[[TestClient, int], httpx.Response]  # (client, the stored job's id) -> the answer
    expect: str  # words the problem says (its detail or a field's location and message)
    settings: dict[str, Any] = field(default_factory=dict)  # overrides of the server's settings
    header: str = ""  # a header the answer must carry


CASES = [
    BadInput("malformed JSON", 400, post('{"name": "x", '), "malformed JSON at line 1 column 15"),
    BadInput("malformed YAML", 400, post("name: [unclosed", "application/yaml"), "malformed YAML"),
    BadInput("a document that is not an object", 400, post("[1, 2]"), "must be a JSON/YAML object of sections"),
    BadInput("NaN or Infinity in JSON", 400, post('{"train": {"lr": NaN}}'), "NaN is not a JSON number"),
    BadInput(
        "more than 10,000 values (a YAML alias bomb)",
        400,
        post(ALIAS_BOMB, "application/yaml"),
        "more than 10000 values",
    ),
    BadInput("a Content-Type other than JSON or YAML", 415, post("name: x", "text/plain"), "is not accepted"),
    BadInput(
        "an empty body (the answer lists every workload kind)",
        422,
        post(b""),
        "workload: required: a spec names its workload: `workload: {kind: compression"
        " | nas | custom | train | transformer, ...}`",
    ),
    BadInput("a spec without `workload.kind`", 422, post_json({"workload": {}}), "workload.kind: required"),
    BadInput("unknown fields", 422, post_json({**tiny_job(), "extra": 1}), "extra: not a field here; the fields here"),
    BadInput(
        "a misspelled field (the answer names the closest field)",
        422,
        post_json(with_changes(data={"batch_sise": 4})),
        "data.batch_sise: not a field here; did you mean `batch_size`?",
    ),
    BadInput(
        "wrong types", 422, post_json(with_changes(train={"epochs": "many"})), "train.epochs: Input should be a valid"
    ),
    BadInput(
        "values outside the engine's ranges or enums",
        422,
        post_json(with_changes(schedule={"mode": "fast"})),
        "schedule.mode: Input should be 'dp', 'ls'",
    ),
    BadInput(
        "a value below its bound (the answer is a sentence with the value sent)",
        422,
        post_json(with_changes(data={"batch_size": -4})),
        "data.batch_size: batch_size must be at least 1; got -4",
    ),
    BadInput(
        "`train.epochs` or `data.num_samples` above the server's bounds",
        422,
        post_json(with_changes(train={"epochs": 11})),
        "train.epochs: at most 10 on this server (PIPEBD_MAX_EPOCHS)",
        {"max_epochs": 10},
    ),
    BadInput(
        "out-of-root paths",
        422,
        post_json(with_changes(data={"dataset": "cifar10", "root": "/etc"})),
        "data.root: '/etc' is outside the data roots",
    ),
    BadInput(
        "a Hugging Face hub id as the teacher (models are not downloaded)",
        422,
        post_json({"workload": {"kind": "transformer", "teacher": "meta-llama/Llama-3.2-1B"}}),
        "workload.teacher: 'meta-llama/Llama-3.2-1B' is a Hugging Face hub id; models are not downloaded: give a"
        " local directory",
    ),
    BadInput(
        "non-allowlisted factories",
        422,
        post_json(with_changes(workload={"factory": "os:system"})),
        "workload.factory: module 'os' is not in this server's factory allowlist; allowed: pipebd_core.workloads",
    ),
    BadInput(
        "a spec the engine's preflight refuses",
        422,
        post_json(with_changes(schedule={"mode": "hybrid", "stages": [{"start": 0, "stop": 2, "replicas": 1}]})),
        "schedule: the last stage stops at block 2 but the workload has 4 blocks",
    ),
    BadInput(
        "a spec whose check outlasts `PIPEBD_SPEC_CHECK_TIMEOUT_S`",
        422,
        post_json(with_changes(data={"dataset": "custom", "factory": SLOW_DATA, "options": {"delay_s": 60}})),
        "checking the spec took longer than 2 s",
        {"spec_check_timeout_s": 2.0, "factory_allowlist": "pipebd_core.workloads,tests.service.slow_data"},
    ),
    BadInput("a missing token", 401, post_json(tiny_job()), "missing bearer token", TOKENS, "www-authenticate"),
    BadInput(
        "an unknown token",
        401,
        post_json(tiny_job(), Authorization="Bearer not-a-known-token-at-all"),
        "unknown bearer token",
        TOKENS,
        "www-authenticate",
    ),
    BadInput(
        "a `read` token on a submit route",
        403,
        post_json(tiny_job(), Authorization=f"Bearer {READ}"),
        "needs a 'submit' token",
        TOKENS,
    ),
    BadInput(
        "a body over `PIPEBD_MAX_BODY_BYTES` (by its Content-Length)",
        413,
        post(b" " * (2 << 20)),
        "larger than this server's limit of 1048576 bytes",
    ),
    BadInput(
        "a body over the limit, streamed without Content-Length",
        413,
        lambda client, _: client.post(JOBS, content=streamed(2 << 20), headers={"Content-Type": "application/json"}),
        "larger than this server's limit",
    ),
    BadInput("a huge page size", 422, get(f"{JOBS}?limit={10**30}"), "query.limit: at most 200 per page"),
    BadInput("a negative page size", 422, get(f"{JOBS}?limit=-1"), "query.limit: Input should be greater than"),
    BadInput("a cursor this API did not return", 422, get(f"{JOBS}?cursor=bm9wZQ"), "was not returned by this API"),
    BadInput("a huge log offset", 422, get(f"{JOBS}/{{job}}/logs?offset={2**64}"), "query.offset: Input should be"),
    BadInput("a negative log offset", 422, get(f"{JOBS}/{{job}}/logs?offset=-1"), "query.offset: Input should be"),
    BadInput(
        "a huge or non-integer `since_step`", 422, get(f"{JOBS}/{{job}}/metrics?since_step=1e20"), "query.since_step"
    ),
    BadInput("an event-stream `after` out of range", 422, get(f"{JOBS}/{{job}}/events?after=1e30"), "query.after"),
    BadInput(
        "a `Last-Event-ID` out of range",
        422,
        get(f"{JOBS}/{{job}}/events", **{"Last-Event-ID": "1" * 23}),
        "header.last-event-id: must be an event id",
    ),
    BadInput(
        "a job id beyond the database's integer range",
        422,
        get(f"{JOBS}/{2**63}"),
        "path.job_id: Input should be less than or equal to 2147483647",
    ),
    BadInput("a job id that does not exist", 404, get(f"{JOBS}/2147483647"), "job 2147483647 does not exist"),
    BadInput(
        "path traversal in an artifact name (`..%2F..%2Fspec.json`)",
        404,
        get(f"{JOBS}/{{job}}/artifacts/..%2F..%2Fspec.json"),
        "no route GET",
    ),
    BadInput("an artifact name that is not an artifact", 422, get(f"{JOBS}/{{job}}/artifacts/..%2E"), "path.name"),
    BadInput("an unknown route", 404, get("/api/v2/jobs"), "no route GET /api/v2/jobs"),
    BadInput(
        "a method a route does not answer",
        405,
        lambda client, job_id: client.put(f"{JOBS}/{job_id}"),
        "PUT is not allowed here",
        header="allow",
    ),
    BadInput(
        "more than `PIPEBD_SUBMISSIONS_PER_MINUTE` submissions in a minute",
        429,
        twice,
        "more than 1 submissions in a minute from this client address",
        {"submissions_per_minute": 1},
        "retry-after",
    ),
    BadInput(
        "a submission while `PIPEBD_MAX_QUEUED_JOBS` jobs are queued",
        429,
        post_json(tiny_job()),
        "1 jobs are queued, this server's limit",
        {"max_queued_jobs": 1},
        "retry-after",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.row for case in CASES])
def test_bad_input(case: BadInput, tmp_path: Path, database_url: str) -> None:
    settings = make_settings(tmp_path, database_url, **case.settings)
    with TestClient(create_app(settings)) as client:
        job = insert_job(settings)  # a queued job, for the rows about one job's routes
        assert job.id is not None
        response = case.send(client, job.id)
    assert response.status_code == case.status, response.text[:2000]
    assert response.headers["content-type"] == "application/problem+json"
    assert len(response.content) <= ANSWER_MAX_BYTES
    problem = response.json()
    assert problem["status"] == case.status and problem["request_id"] == response.headers["x-request-id"]
    assert case.expect in problem_text(problem), problem
    assert not case.header or case.header in response.headers
    assert_only_the_stored_job(settings)


def assert_only_the_stored_job(settings: Settings) -> None:
    assert count_rows(settings, Job) == 1
    assert count_rows(settings, JobEvent) == 0
    assert broker_messages(settings) == 0
    assert not any(settings.runs.iterdir())


def documented_rows() -> list[tuple[str, int]]:
    """The rows of the bad-input table in docs/limits.md: (what is sent, the status it gets)."""
    lines = (REPO / "docs" / "limits.md").read_text().split("\n## Bad input\n", 1)[1].splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith("|"))
    end = next(index for index in range(start, len(lines)) if not lines[index].startswith("|"))
    rows = lines[start + 2 : end]  # after the header and its rule
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    return [(what, int(re.match(r"\d+", status).group())) for what, status, *_ in cells]  # type: ignore[union-attr]


def test_the_documented_table_is_this_table() -> None:
    assert documented_rows() == [(case.row, case.status) for case in CASES]


def test_data_under_a_root_passes_the_path_check(client: TestClient, settings: Settings) -> None:
    root = settings.roots[0] / "cifar"
    response = client.post(JOBS, json=with_changes(data={"dataset": "cifar10", "root": str(root)}))
    # past the policy: the engine's own check now says the data is missing, naming the path
    assert response.status_code == 422 and "outside the data roots" not in problem_text(response.json())
    assert str(root) in problem_text(response.json())
    assert count_rows(settings, Job) == 0 and broker_messages(settings) == 0


def test_yaml_and_json_refusals_name_the_same_fields(client: TestClient) -> None:
    document = with_changes(train={"epochs": 0}, data={"bogus": 1})
    as_json = client.post(JOBS, json=document).json()
    as_yaml = client.post(JOBS, content=yaml.safe_dump(document), headers={"Content-Type": "application/yaml"}).json()
    assert [item["loc"] for item in as_json["errors"]] == [item["loc"] for item in as_yaml["errors"]]
    assert sorted(item["loc"] for item in as_json["errors"]) == [["body", "data", "bogus"], ["body", "train", "epochs"]]
