"""Service tier: /openapi.json documents every response body, and real bodies match their declared models.

Every GET route under /api/v1 (and /healthz) must declare its 200 body: a JSON schema with properties
or a `$ref` to one, or, for the downloads and the event stream, the media types it sends. Then a job
with a real plan.json (resolved by the engine for the tiny workload, with predictions from a profile
written by hand), logs and telemetry (lines, rollups, and rollups stored before `cur_mem` existed) is
read through the API: each body validates against the model /openapi.json names for it, and is exactly
what the code behind it builds (same keys, same values, same int or float types), so the models drop nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel
from sqlmodel import Session, col, select

from app.api import compare_schemas, schemas
from app.core.database import get_engine
from app.core.downsample import to_point
from app.core.rollups import RollupBuilder, chart_points
from app.core.settings import Settings
from app.core.states import RUNNING
from app.core.tables import EVAL_SEQ, JobMetric
from pipebd_core.documents.telemetry import DistillLine, EvalLine
from pipebd_core.planning.distill_planner import resolve_plan
from tests.fake_profiles import fake_profile
from tests.helpers import tiny_spec
from tests.service.factories import insert_job, insert_metrics
from tests.telemetry_lines import distill_line, finetune_line

API = "/api/v1"
JOBS = f"{API}/jobs"
NOT_JSON = {  # routes whose 200 body is not JSON: the media types they must document
    f"{JOBS}/{{job_id}}/artifacts/{{name}}": {"application/octet-stream", "application/json", "text/csv"},
    f"{JOBS}/{{job_id}}/events": {"text/event-stream"},
}


def same_json(left: Any, right: Any, path: str = "$") -> list[str]:
    """Where two decoded JSON values differ, types included (1 is not 1.0), key order aside."""
    if type(left) is not type(right):
        return [f"{path}: {left!r} ({type(left).__name__}) != {right!r} ({type(right).__name__})"]
    if isinstance(left, dict):
        if left.keys() != right.keys():
            return [f"{path}: keys {sorted(left)} != {sorted(right)}"]
        return [issue for key in left for issue in same_json(left[key], right[key], f"{path}.{key}")]
    if isinstance(left, list):
        if len(left) != len(right):
            return [f"{path}: {len(left)} items != {len(right)}"]
        return [
            issue for i, (a, b) in enumerate(zip(left, right, strict=True)) for issue in same_json(a, b, f"{path}[{i}]")
        ]
    return [] if left == right else [f"{path}: {left!r} != {right!r}"]


def declared_model(client: TestClient, path: str) -> type[BaseModel]:
    """The model that /openapi.json names for the 200 body of GET `path` (one of app/api/schemas.py)."""
    responses = client.get("/openapi.json").json()["paths"][path]["get"]["responses"]
    name = responses["200"]["content"]["application/json"]["schema"]["$ref"].removeprefix("#/components/schemas/")
    model = getattr(schemas, name, None)
    assert isinstance(model, type) and issubclass(model, BaseModel), f"GET {path}: {name} is not in app/api/schemas"
    return model


def check_body(client: TestClient, route_path: str, url: str, expected: Any) -> dict[str, Any]:
    """GET `url`: 200, the body validates against the route's model and is `expected` exactly."""
    response = client.get(url)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    model = declared_model(client, route_path)
    parsed = model.model_validate(body)
    assert not same_json(parsed.model_dump(mode="json", exclude_unset=True), body)
    issues = same_json(body, expected)
    assert not issues, issues[:5]
    return body


def resolve(schema: dict[str, Any], document: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    resolved: dict[str, Any] = document["components"]["schemas"][ref.removeprefix("#/components/schemas/")]
    return resolved


def test_every_get_route_documents_its_body(client: TestClient) -> None:
    document = client.get("/openapi.json").json()
    checked = []
    for path, operations in document["paths"].items():
        if not (path.startswith(f"{API}/") or path == "/healthz") or "get" not in operations:
            continue
        checked.append(path)
        content = operations["get"]["responses"]["200"].get("content", {})
        if path in NOT_JSON:
            assert NOT_JSON[path] <= set(content), f"GET {path}: 200 documents {sorted(content)}"
            assert all(media.get("schema") for media in content.values()), f"GET {path}: {content}"
            continue
        schema = content.get("application/json", {}).get("schema", {})
        assert "$ref" in schema or "properties" in schema, f"GET {path}: the 200 body has no schema ({schema})"
        assert resolve(schema, document).get("properties"), f"GET {path}: {schema} has no properties"
    assert len(checked) >= 9  # jobs, job, plan, metrics, logs, artifacts, artifact, events, healthz


def test_error_responses_are_documented(client: TestClient) -> None:
    """Every error a route can answer is documented, each as a problem body (application/problem+json)."""
    paths = client.get("/openapi.json").json()["paths"]
    expected = {
        ("get", f"{JOBS}/{{job_id}}"): {"404", "422"},
        ("post", f"{JOBS}/{{job_id}}/cancel"): {"404", "422"},
        ("delete", f"{JOBS}/{{job_id}}"): {"404", "409", "422"},
        ("get", f"{JOBS}/{{job_id}}/plan"): {"404", "422"},
        ("get", f"{JOBS}/{{job_id}}/metrics"): {"404", "422"},
        ("get", f"{JOBS}/{{job_id}}/logs"): {"404", "422"},
        ("get", f"{JOBS}/{{job_id}}/artifacts"): {"404", "422"},
        ("get", f"{JOBS}/{{job_id}}/artifacts/{{name}}"): {"404", "422"},
        ("get", f"{JOBS}/{{job_id}}/events"): {"404", "422"},
        ("post", JOBS): {"400", "413", "415", "422", "429", "503"},
        ("get", JOBS): {"422"},
        ("get", "/healthz"): {"503"},
    }
    operations = [(method, path) for path, item in paths.items() for method in item]
    assert set(expected) <= set(operations)
    for method, path in operations:
        responses = paths[path][method]["responses"]
        codes = expected.get((method, path), set()) | {"500"} | ({"401", "403"} if path != "/healthz" else set())
        assert codes <= set(responses), f"{method.upper()} {path} documents {sorted(responses)}"
        errors = [code for code in responses if int(code) >= 400]
        for code in errors:
            content = responses[code]["content"]
            assert list(content) == ["application/problem+json"], (method, path, code, list(content))
            assert content["application/problem+json"]["schema"] == {"$ref": "#/components/schemas/Problem"}


def test_schema_says_what_the_server_accepts(client: TestClient, settings: Settings) -> None:
    """The spec body is the engine's model (no unknown fields, enums, ranges) with this server's bounds; the
    list's `state` is an enum and its `limit` bounded; ids stay within the database's integer range."""
    document = client.get("/openapi.json").json()
    components = document["components"]["schemas"]
    body = document["paths"][JOBS]["post"]["requestBody"]["content"]
    assert {media: spec["schema"] for media, spec in body.items()} == {
        "application/json": {"$ref": "#/components/schemas/Spec"},
        "application/yaml": {"$ref": "#/components/schemas/Spec"},
    }
    spec = components["Spec"]
    assert spec["required"] == ["workload"] and components["WorkloadSpec"]["required"] == ["kind"]
    for name in ("Spec", "WorkloadSpec", "DataSpec", "TrainSpec", "ScheduleSpec", "StageSpec"):
        assert components[name]["additionalProperties"] is False, name
    assert components["ScheduleSpec"]["properties"]["mode"]["enum"] == [
        "dp",
        "ls",
        "ir",
        "tr",
        "tr_dpu",
        "hybrid",
        "auto",
    ]
    epochs = components["TrainSpec"]["properties"]["epochs"]
    assert epochs["minimum"] == 1 and epochs["maximum"] == settings.max_epochs
    assert components["DataSpec"]["properties"]["num_samples"]["maximum"] == settings.max_num_samples
    listing = {p["name"]: p["schema"] for p in document["paths"][JOBS]["get"]["parameters"]}
    assert listing["limit"]["maximum"] == settings.page_limit_max
    states = listing["state"]["anyOf"][0]["enum"]
    assert states == [
        "queued",
        "starting",
        "running",
        "pausing",
        "paused",
        "cancelling",
        "succeeded",
        "failed",
        "cancelled",
    ]
    assert components["JobPublic"]["properties"]["state"]["enum"] == states
    job_id = next(p for p in document["paths"][f"{JOBS}/{{job_id}}"]["get"]["parameters"] if p["name"] == "job_id")
    assert job_id["schema"]["minimum"] == 1 and job_id["schema"]["maximum"] == 2**31 - 1
    stream = document["paths"][f"{JOBS}/{{job_id}}/events"]["get"]["responses"]["200"]["content"]
    assert list(stream) == ["text/event-stream"]
    event = stream["text/event-stream"]["itemSchema"]
    assert event["properties"]["event"]["enum"] == ["state", "phase", "metrics", "log", "end"]
    assert event["properties"]["data"]["contentMediaType"] == "application/json"


@pytest.mark.parametrize("module", [schemas, compare_schemas], ids=lambda module: module.__name__)
def test_models_describe_every_field(module: ModuleType) -> None:
    answers = [getattr(module, name) for name in dir(module)]
    for model in answers:
        name = getattr(model, "__name__", "")
        ours = model.__module__ == module.__name__ if isinstance(model, type) else False
        if ours and issubclass(model, BaseModel):
            assert model.__doc__, name
            missing = [field for field, info in model.model_fields.items() if not info.description]
            assert not missing, f"{name}: no description for {missing}"


@pytest.fixture(scope="module")
def profiled_plan() -> dict[str, Any]:
    """plan.json of the 2-rank tiny job as the engine writes it, with the predictions of a profiled job."""
    profile = fake_profile([1.0, 2.0, 1.0, 1.5], [0.2, 0.3, 0.2, 0.1], nproc=2, batch_size=10)
    plan = resolve_plan(tiny_spec(schedule={"mode": "tr_dpu", "nproc": 2, "profile": True}), profile).to_json()
    written: dict[str, Any] = json.loads(json.dumps(plan, default=str))  # as RunDir.write_json writes it
    return written


def test_plan_logs_and_artifacts_match_their_models(
    client: TestClient, settings: Settings, tmp_path: Path, profiled_plan: dict[str, Any]
) -> None:
    run = tmp_path / "run"
    (run / "logs" / "distill").mkdir(parents=True)
    plan = {**profiled_plan, "from_a_newer_engine": {"kept": [1, 2.5, None]}}  # unknown keys pass through
    plan["stages"] = [{**stage, "note": "kept"} for stage in plan["stages"]]
    assert {"predicted_step_s", "alternatives", "simulation", "estimates", "routes", "ranks"} <= plan.keys()
    (run / "plan.json").write_text(json.dumps(plan, indent=2))
    (run / "logs" / "distill" / "rank-1.log").write_bytes("épochs \xff\n".encode() + b"\xff done\n")
    job = insert_job(settings, state=RUNNING, run_dir=str(run))
    plan_path = f"{JOBS}/{{job_id}}/plan"
    check_body(client, plan_path, f"{JOBS}/{job.id}/plan", plan)
    dp_plan = resolve_plan(tiny_spec(schedule={"mode": "dp", "nproc": 2, "profile": False}), None).to_json()
    (run / "plan.json").write_text(json.dumps(dp_plan, indent=2))
    check_body(client, plan_path, f"{JOBS}/{job.id}/plan", json.loads(json.dumps(dp_plan)))  # no predictions

    text = (run / "logs" / "distill" / "rank-1.log").read_bytes()
    logs = check_body(
        client,
        f"{JOBS}/{{job_id}}/logs",
        f"{JOBS}/{job.id}/logs?rank=1&offset=1&limit=8",  # from inside the "é" to inside the "ÿ"
        {
            "job_id": job.id,
            "phase": "distill",
            "rank": 1,
            "node": None,  # a rank's log; node k's launcher log is asked for with ?node=k
            "file": "logs/distill/rank-1.log",
            "offset": 1,
            "next_offset": 9,
            "size": len(text),
            "text": text[1:9].decode("utf-8", "replace"),
        },
    )
    assert logs["text"].startswith("\ufffdpochs") and logs["text"].endswith("\ufffd")
    launcher = f"{JOBS}/{job.id}/logs"
    expected_launcher = {"job_id": job.id, "phase": "distill", "rank": None, "node": 0}
    expected_launcher["file"] = "logs/distill/launcher.log"
    expected_launcher.update(offset=0, next_offset=0)
    check_body(client, f"{JOBS}/{{job_id}}/logs", launcher, {**expected_launcher, "size": 0, "text": ""})

    entry = {"media_type": "application/json", "description": "the resolved plan", "name": "plan.json"}
    size = (run / "plan.json").stat().st_size
    expected = {
        "job_id": job.id,
        "state": RUNNING,
        "data": [{**entry, "size": size, "url": f"{JOBS}/{job.id}/artifacts/plan.json", "sha256_url": None}],
    }
    check_body(client, f"{JOBS}/{{job_id}}/artifacts", f"{JOBS}/{job.id}/artifacts", expected)


def telemetry(rank: int, seq: int, gpu: bool) -> DistillLine:
    return distill_line(
        rank,
        seq - 1,
        time=1000.0 + seq,
        epoch=seq // 50,
        loss={rank: 1.0 / seq},
        phases={"data": 0.001, "teacher": 0.01 * (seq % 3), "student": 0.02},
        samples=5,
        peak_mem=1000 + seq,
        cur_mem=900 + seq,
        done=seq,
        total=300,
        gpu_util=seq % 100 if gpu and seq % 4 else None,  # NVML answers now and then: integer percentages
    )


def test_metrics_match_their_model(client: TestClient, settings: Settings) -> None:
    job = insert_job(settings, state=RUNNING)
    assert job.id is not None
    builder = RollupBuilder(job.id)
    with Session(get_engine(settings.database)) as session:
        for rank in (0, 1):
            lines = [telemetry(rank, seq, gpu=rank == 0) for seq in range(1, 301)]
            rows = [
                JobMetric(
                    job_id=job.id, rank=rank, seq=r.seq, epoch=r.epoch, step=r.step, time=r.time, record=r.to_json()
                )
                for r in lines
            ]
            rollups = builder.add([to_point(line) for line in lines])
            if rank == 1:  # rollups stored before cur_mem and gpu_util were recorded
                for rollup in rollups:
                    rollup.point = {k: v for k, v in rollup.point.items() if k not in ("cur_mem", "gpu_util")}
            session.add_all([*rows, *rollups])
        session.commit()
    route = f"{JOBS}/{{job_id}}/metrics"
    for max_points in (500, 100, 40, 7):
        with Session(get_engine(settings.database)) as session:
            points, total = chart_points(session, job.id, [0, 1], max_points)
        expected = {"job_id": job.id, "phase": "distill", "evals": [], "total": total, "max_points": max_points}
        expected["downsampled"] = len(points) < total
        body = check_body(
            client, route, f"{JOBS}/{job.id}/metrics?max_points={max_points}", {**expected, "points": points}
        )
        assert {type(p["samples"]) for p in body["points"] if p["count"] == 1} <= {int}  # not turned into 5.0
    old = client.get(f"{JOBS}/{job.id}/metrics", params={"rank": 1, "max_points": 100}).json()["points"]
    assert old[0]["count"] == 4 and "cur_mem" not in old[0] and "gpu_util" not in old[0]  # not added as nulls

    other = insert_job(settings, state=RUNNING)
    assert other.id is not None
    insert_metrics(settings, other.id, rank=0, losses=[1.0, 0.5, 2.0])
    page = check_body(
        client,
        route,
        f"{JOBS}/{other.id}/metrics?since_step=1",
        {
            "job_id": other.id,
            "phase": "distill",
            "evals": [],
            "total": 2,
            "downsampled": False,
            "max_points": 500,
            "points": page_points(settings, other.id),
        },
    )
    assert page["points"][0]["cur_mem"] == 0 and page["points"][0]["step"] == 1


def test_finetune_telemetry_is_kept_apart_with_its_evaluations(client: TestClient, settings: Settings) -> None:
    job = insert_job(settings, state=RUNNING)
    assert job.id is not None
    insert_metrics(settings, job.id, rank=0, losses=[1.0, 0.5])  # two distillation lines
    with Session(get_engine(settings.database)) as session:
        for seq in (1, 2, 3):
            line = finetune_line(1, seq - 1, time=1.0 + seq, loss=2.0 / seq, acc=0.25 * seq, samples=12, peak_mem=10)
            line.times = {"F": 0.1, "I": 0.1, "W": 0.05}
            record = line.to_json()
            session.add(
                JobMetric(
                    job_id=job.id, phase="finetune", rank=1, seq=seq, epoch=0, step=seq - 1, time=1.0, record=record
                )
            )
        evaluation = EvalLine(time=9.0, rank=0, epoch=1, step=2, top1=0.8).to_json()
        session.add(
            JobMetric(
                job_id=job.id, phase="finetune", rank=0, seq=EVAL_SEQ, epoch=1, step=2, time=9.0, record=evaluation
            )
        )
        session.commit()
    body = client.get(f"{JOBS}/{job.id}/metrics", params={"phase": "finetune"}).json()
    schemas.MetricsPage.model_validate(body)
    assert body["phase"] == "finetune" and body["total"] == 3
    assert [p["loss"] for p in body["points"]] == [{"network": 2.0}, {"network": 1.0}, {"network": 2.0 / 3}]
    assert [p["acc"] for p in body["points"]] == [0.25, 0.5, 0.75] and body["points"][0]["phases"]["W"] == 0.05
    assert body["evals"] == [{"epoch": 1, "step": 2, "top1": 0.8, "perplexity": None}]
    distill = client.get(f"{JOBS}/{job.id}/metrics").json()
    assert distill["total"] == 2 and distill["evals"] == [] and {p["rank"] for p in distill["points"]} == {0}


def page_points(settings: Settings, job_id: int) -> list[dict[str, Any]]:
    with Session(get_engine(settings.database)) as session:
        query = select(JobMetric).where(JobMetric.job_id == job_id, JobMetric.step >= 1).order_by(col(JobMetric.seq))
        return [to_point(DistillLine.from_json(row.record)) for row in session.exec(query).all()]


def test_health_matches_its_model(client: TestClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert schemas.Health.model_validate(response.json()).model_dump() == response.json()
