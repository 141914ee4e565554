"""Service tier: sweeps through the real API on real databases (SQLite and PostgreSQL) and the real SQLite
broker, no worker: children are created with exactly their overrides, a bad override refuses the whole sweep
naming it with nothing stored, the bulk operations reach every child, `max_parallel` holds at the claim, and
the best child is the one with the best objective (summaries written by the test), and a sweep's own
webhook events: each new best once, its end once, also when its last two children end at once."""

from __future__ import annotations

import json
import math
import random
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.cli.main import main
from app.core.database import get_engine
from app.core.lifecycle import request_cancel, transition
from app.core.priority import next_queued
from app.core.settings import Settings
from app.core.states import RUNNING, STARTING, SUCCEEDED
from app.core.sweeps import claim_room, wake
from app.core.tables import Job, JobEvent, Sweep
from app.main import create_app
from pipebd_core.documents.summary import Summary
from pipebd_core.spec import parse_spec
from tests.service.conftest import make_settings
from tests.service.factories import (
    broker_messages,
    count_rows,
    insert_sweep,
    long_job,
    queued_job,
    stored,
    tiny_job,
    write_summary,
)
from tests.service.live import serve
from worker.launcher import JobRunner

SWEEPS = "/api/v1/sweeps"
HOOKS = "/api/v1/webhooks"


def with_overrides(document: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """The oracle: the base spec with each dotted field set, as every default filled in."""
    result = {section: dict(values) if isinstance(values, dict) else values for section, values in document.items()}
    for path, value in overrides.items():
        section, name = path.split(".")
        result[section][name] = value
    return parse_spec(result).model_dump(mode="json")


def test_a_grid_sweep_queues_one_child_per_combination_with_exactly_its_overrides(
    client: TestClient, settings: Settings
) -> None:
    base = tiny_job("grid")
    grid = {"train.lr": [0.01, 0.05], "train.epochs": [1, 2]}
    response = client.post(SWEEPS, json={"spec": base, "grid": grid, "max_parallel": 2})
    assert response.status_code == 202, response.text
    sweep = response.json()
    assert response.headers["location"] == f"{SWEEPS}/{sweep['id']}"
    expected = [{"train.lr": lr, "train.epochs": epochs} for lr in (0.01, 0.05) for epochs in (1, 2)]
    assert [job["overrides"] for job in sweep["jobs"]] == expected
    for job, overrides in zip(sweep["jobs"], expected, strict=True):
        stored = client.get(f"/api/v1/jobs/{job['id']}").json()
        assert stored["spec"] == with_overrides(base, overrides) and stored["sweep_id"] == sweep["id"]
    assert sweep["state"] == "queued" and sweep["max_parallel"] == 2 and sweep["search"] == {"grid": grid}
    assert sweep["progress"]["jobs"]["queued"] == sweep["progress"]["total"] == 4
    assert sweep["progress"]["fraction"] == 0.0 and sweep["best"] is None
    assert broker_messages(settings) == 4
    listed = client.get(SWEEPS).json()["data"]
    assert [(item["id"], item["state"]) for item in listed] == [(sweep["id"], "queued")] and "jobs" not in listed[0]


def test_a_random_sweep_draws_its_children_from_the_seed(client: TestClient) -> None:
    fields = {
        "train.lr": {"min": 0.001, "max": 0.1, "log": True},
        "train.epochs": [1, 2, 3],
        "train.seed": {"min": 0, "max": 9},
    }
    body = {"spec": tiny_job("random"), "random": {"count": 5, "seed": 7, "fields": fields}}
    first = client.post(SWEEPS, json=body).json()["jobs"]
    rng = random.Random(7)  # the documented draws, in the order the fields are given
    expected = [
        {
            "train.lr": math.exp(rng.uniform(math.log(0.001), math.log(0.1))),
            "train.epochs": rng.choice([1, 2, 3]),
            "train.seed": rng.randint(0, 9),
        }
        for _ in range(5)
    ]
    assert [job["overrides"] for job in first] == expected
    assert all(0.001 <= job["overrides"]["train.lr"] <= 0.1 for job in first)
    for job in first:
        spec = client.get(f"/api/v1/jobs/{job['id']}").json()["spec"]
        assert (
            spec["train"]["lr"] == job["overrides"]["train.lr"]
            and spec["train"]["seed"] == job["overrides"]["train.seed"]
        )
    again = client.post(SWEEPS, json=body).json()["jobs"]
    assert [job["overrides"] for job in again] == expected  # the same seed draws the same children


def refused(client: TestClient, settings: Settings, body: dict[str, Any]) -> dict[str, Any]:
    """The problem of a refused sweep, after checking that nothing was stored or published."""
    response = client.post(SWEEPS, json=body)
    assert response.status_code == 422, response.text
    assert count_rows(settings, Sweep) == count_rows(settings, Job) == count_rows(settings, JobEvent) == 0
    assert broker_messages(settings) == 0
    problem: dict[str, Any] = response.json()
    return problem


def test_a_bad_override_refuses_the_whole_sweep_naming_it(client: TestClient, settings: Settings) -> None:
    base = tiny_job("bad")
    problem = refused(client, settings, {"spec": base, "grid": {"train.lr": [0.01, -1.0]}})
    assert [item["loc"] for item in problem["errors"]] == [["body", "grid", "train.lr"]]
    assert "child 1 (train.lr=-1.0): train.lr:" in problem["detail"] and "nothing was stored" in problem["detail"]
    problem = refused(client, settings, {"spec": base, "list": [{"train.lr": 0.01}, {"train.lrr": 0.05}]})
    assert problem["errors"][0]["loc"] == ["body", "list", 1, "train.lrr"]
    assert "not a field here" in problem["errors"][0]["message"]
    problem = refused(client, settings, {"spec": base, "grid": {"train.lr.value": [0.01]}})
    assert problem["errors"][0]["loc"] == ["body", "grid", "train.lr.value"]
    assert "'lr' is not a section" in problem["detail"]
    problem = refused(client, settings, {"spec": {**base, "train": {"epochs": 0}}, "grid": {"train.lr": [0.01]}})
    assert problem["errors"][0]["loc"] == ["body", "spec", "train", "epochs"]  # the base spec's own field
    problem = refused(client, settings, {"spec": base, "grid": {"train.lr": [0.01]}, "list": [{}]})
    assert "give exactly one search of grid, list, random; got grid, list" in problem["detail"]
    too_big = {"schedule.nproc": [1, 64]}  # the engine's preflight: more ranks than the tiny workload's blocks
    problem = refused(client, settings, {"spec": base, "grid": too_big})
    assert problem["errors"][0]["loc"] == ["body", "grid", "schedule.nproc"] and "child 1" in problem["detail"]


def test_bulk_pause_resume_and_cancel_reach_every_child(client: TestClient, settings: Settings) -> None:
    sweep = client.post(SWEEPS, json={"spec": long_job(), "grid": {"train.lr": [0.01, 0.02, 0.03]}}).json()
    ids = [job["id"] for job in sweep["jobs"]]
    with Session(get_engine(settings.database)) as session:  # as a worker would: the first child runs
        assert transition(session, ids[0], STARTING, ["queued"], worker="w")
        assert transition(session, ids[0], RUNNING, [STARTING])
        session.commit()
    paused = client.post(f"{SWEEPS}/{sweep['id']}/pause").json()
    assert [job["state"] for job in paused["jobs"]] == ["pausing", "paused", "paused"]
    assert paused["state"] == "running"  # the first child is still stopping
    messages = broker_messages(settings)
    resumed = client.post(f"{SWEEPS}/{sweep['id']}/resume").json()
    assert [job["state"] for job in resumed["jobs"]] == ["pausing", "queued", "queued"]
    assert broker_messages(settings) == messages + 2
    cancelled = client.post(f"{SWEEPS}/{sweep['id']}/cancel").json()
    assert [job["state"] for job in cancelled["jobs"]] == ["cancelling", "cancelled", "cancelled"]
    assert cancelled["progress"]["finished"] == 2 and cancelled["progress"]["jobs"]["cancelling"] == 1
    again = client.post(f"{SWEEPS}/{sweep['id']}/resume")
    assert again.status_code == 200 and [job["state"] for job in again.json()["jobs"]][1:] == ["queued", "queued"]
    assert client.post(f"{SWEEPS}/{sweep['id'] + 1}/cancel").status_code == 404


def test_max_parallel_holds_at_the_claim_and_an_ended_child_wakes_the_next(
    client: TestClient, settings: Settings
) -> None:
    sweep = client.post(SWEEPS, json={"spec": long_job(), "grid": {"train.lr": [0.01, 0.02]}, "max_parallel": 1}).json()
    first, second = (job["id"] for job in sweep["jobs"])
    other = queued_job(settings)  # a job of no sweep, submitted after the sweep
    with Session(get_engine(settings.database)) as session:
        assert claim_room(session, first) and transition(session, first, STARTING, ["queued"], worker="w")
        session.commit()
    assert next_queued(settings.database, devices=4) == other  # the sweep's second child waits
    reason = client.get(f"/api/v1/jobs/{second}").json()["waiting_reason"]
    assert reason == f"its sweep {sweep['id']} already runs 1 of its jobs (max_parallel 1); it starts when one ends"
    with Session(get_engine(settings.database)) as session:
        assert not claim_room(session, second)
        assert transition(session, first, RUNNING, [STARTING]) and transition(session, first, SUCCEEDED, [RUNNING])
        session.commit()
    published: list[tuple[int, str]] = []
    assert wake(settings.database, first, lambda job_id, queue: published.append((job_id, queue))) == second
    assert published == [(second, "pipebd.ranks-2")]
    assert next_queued(settings.database, devices=4, skip=frozenset({other})) == second
    with Session(get_engine(settings.database)) as session:
        assert claim_room(session, second)


def four_children_minimizing_loss(client: TestClient, name: str) -> tuple[dict[str, Any], dict[str, Any], list[int]]:
    """A sweep of four learning rates with the objective `minimize final_loss`: its body, answer, children's ids."""
    body = {
        "spec": tiny_job(name),
        "grid": {"train.lr": [0.01, 0.02, 0.03, 0.04]},
        "objective": {"metric": "final_loss", "goal": "minimize"},
    }
    sweep = client.post(SWEEPS, json=body).json()
    return body, sweep, [job["id"] for job in sweep["jobs"]]


def test_the_best_child_has_the_best_objective(client: TestClient, settings: Settings) -> None:
    body, sweep, ids = four_children_minimizing_loss(client, "best")
    losses = {
        ids[0]: {0: math.nan},
        ids[1]: {0: 0.9, 1: 0.7},
        ids[2]: {0: 0.2, 1: 0.4},
    }  # ids[0] diverged, ids[3]: none yet
    for job_id, per_block in losses.items():
        write_summary(settings, job_id, Summary(name="tiny", final_loss=per_block))
    read = client.get(f"{SWEEPS}/{sweep['id']}").json()
    assert read["best"] == {"job_id": ids[2], "value": pytest.approx(0.3)}
    assert [job["objective_value"] for job in read["jobs"]] == [None, pytest.approx(0.8), pytest.approx(0.3), None]
    assert read["objective"] == {"metric": "final_loss", "goal": "minimize"}
    bad = {**body, "objective": {"metric": "accuracy", "goal": "minimize"}}
    response = client.post(SWEEPS, json=bad)
    assert response.status_code == 422 and response.json()["errors"][0]["loc"] == ["body", "objective", "metric"]


def test_a_sweep_that_does_not_exist_is_a_404(client: TestClient) -> None:
    missing = client.get(f"{SWEEPS}/9")
    assert missing.status_code == 404 and missing.json()["detail"] == "sweep 9 does not exist"


def test_pipebd_sweep_submits_a_grid_and_names_a_bad_override(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'cli.db'}")
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(tiny_job("cli")))
    with serve(create_app(settings)) as url:
        grid = ["--grid", "train.lr=0.01,0.05", "--grid", "train.epochs=1,2"]
        assert main(["sweep", str(spec), *grid, "--objective", "final_loss:minimize", "--server", url, "--json"]) == 0
        sweep = json.loads(capsys.readouterr().out)
        expected = [{"train.lr": lr, "train.epochs": epochs} for lr in (0.01, 0.05) for epochs in (1, 2)]
        assert [job["overrides"] for job in sweep["jobs"]] == expected
        assert sweep["objective"] == {"metric": "final_loss", "goal": "minimize"}
        assert (
            main(["sweep", str(spec), "--grid", "train.lr=0.01", "--random", "3", "--seed", "4", "--server", url]) == 0
        )
        printed = capsys.readouterr().out
        assert printed.startswith(f"pipebd: sweep {sweep['id'] + 1} queued") and printed.count("train.lr=0.01") == 3
        assert main(["sweep", str(spec), "--grid", "train.lr=0.01,-1", "--server", url]) == 2
        assert "HTTP 422: grid.train.lr: child 1 (train.lr=-1): train.lr:" in capsys.readouterr().err
        assert main(["sweep", str(spec), "--server", url]) == 2
        assert "give the fields to sweep with --grid" in capsys.readouterr().err


def test_a_child_leaving_its_worker_wakes_the_next_child_of_its_sweep(tmp_path: Path) -> None:
    """The worker's end of a run publishes the sweep's waiting child; here the first child cannot be planned
    (more ranks than blocks), so it ends at once, in this process, without launching anything."""
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'pipebd.db'}")
    _, (first, second) = insert_sweep(settings, [{"schedule.nproc": 64}, {}], max_parallel=1)
    with Session(get_engine(settings.database)) as session:
        job = session.get(Job, first)
        assert job is not None
        job.spec = tiny_job(schedule={"nproc": 64})
        session.add(job)
        session.commit()
    published: list[tuple[int, str]] = []
    runner = JobRunner(
        first, settings, threading.Event(), publish=lambda job_id, queue: published.append((job_id, queue))
    )
    assert runner.run() == "failed"
    assert stored(settings, first).termination_reason == "launch_error" and published == [(second, "pipebd.ranks-2")]


def test_two_claims_in_one_full_sweep_count_one_after_the_other(settings: Settings) -> None:
    """The second claim waits on the sweep's lock until the first commits, then sees the sweep full."""
    _, (first, second) = insert_sweep(settings, [{}, {}], max_parallel=1)
    engine = get_engine(settings.database)
    found: dict[str, bool] = {}

    def claim_second() -> None:
        with Session(engine) as session:
            found["room"] = claim_room(session, second)
            session.rollback()

    with Session(engine) as session:
        assert claim_room(session, first) and transition(session, first, STARTING, ["queued"], worker="a")
        other = threading.Thread(target=claim_second)
        other.start()
        other.join(timeout=1.0)
        assert other.is_alive() and found == {}  # it waits for this claim's transaction
        session.commit()
    other.join(timeout=30)
    assert found == {"room": False}


def sweep_deliveries(client: TestClient, hook_id: int) -> list[dict[str, Any]]:
    """A hook's deliveries, oldest first: (event, payload)."""
    answer = client.get(f"/api/v1/webhooks/{hook_id}/deliveries")
    assert answer.status_code == 200, answer.text
    return list(reversed(answer.json()["data"]))


def end_child(settings: Settings, job_id: int, loss: float | None) -> None:
    """A child run to success by its worker (its summary written first, as finalize does), or cancelled."""
    if loss is not None:
        write_summary(settings, job_id, Summary(name="tiny", final_loss={0: loss}))
    with Session(get_engine(settings.database)) as session:
        if loss is None:
            assert request_cancel(session, job_id)
        else:
            assert transition(session, job_id, STARTING, ["queued"], worker="w")
            assert transition(session, job_id, RUNNING, [STARTING])
            assert transition(session, job_id, SUCCEEDED, [RUNNING])
        session.commit()


def test_a_sweep_notifies_each_new_best_and_its_end_once(client: TestClient, settings: Settings) -> None:
    _, sweep, ids = four_children_minimizing_loss(client, "notify")
    hook = {"url": "http://127.0.0.1:9/hook", "secret": "s" * 16}
    sweep_events = ["sweep.finished", "sweep.best_changed", "job.succeeded"]
    scoped = client.post(HOOKS, json={**hook, "events": sweep_events, "scope": "sweep", "sweep_id": sweep["id"]})
    assert scoped.status_code == 201 and scoped.json()["sweep_id"] == sweep["id"], scoped.text
    server = client.post(HOOKS, json={**hook, "events": ["sweep.finished"]}).json()["id"]
    own = client.post(HOOKS, json={**hook, "events": ["sweep.finished"], "scope": "job", "job_id": ids[0]}).json()
    missing = client.post(HOOKS, json={**hook, "events": sweep_events, "scope": "sweep", "sweep_id": sweep["id"] + 1})
    assert missing.status_code == 422 and missing.json()["errors"][0]["loc"] == ["body", "sweep_id"]

    for job_id, loss in zip(ids, (0.5, 0.7, 0.2, None), strict=True):  # a first best, a worse one, a better one
        end_child(settings, job_id, loss)
    events = [(entry["event"], entry["job_id"]) for entry in sweep_deliveries(client, scoped.json()["id"])]
    assert events == [
        ("job.succeeded", ids[0]),
        ("sweep.best_changed", ids[0]),
        ("job.succeeded", ids[1]),
        ("job.succeeded", ids[2]),
        ("sweep.best_changed", ids[2]),
        ("sweep.finished", ids[3]),
    ]
    payloads = [entry["payload"] for entry in sweep_deliveries(client, scoped.json()["id"])]
    changed = payloads[4]["sweep"]
    assert changed["best"] == {"job_id": ids[2], "value": pytest.approx(0.2)}
    assert changed["previous_best"] == {"job_id": ids[0], "value": pytest.approx(0.5)}
    finished = payloads[5]
    assert finished["job"] is None and finished["sweep"]["state"] == "cancelled"
    assert finished["sweep"]["jobs"] == {"succeeded": 3, "cancelled": 1}
    assert finished["text"] == (
        f"PipeBD sweep {sweep['id']} (notify): cancelled, 4 jobs (3 succeeded, 1 cancelled);"
        f" best job {ids[2]} (final_loss 0.2)"
    )
    assert [entry["event"] for entry in sweep_deliveries(client, server)] == ["sweep.finished"]
    assert sweep_deliveries(client, own["id"]) == []  # a job's hook hears that job's events, not its sweep's

    resumed = client.post(f"{SWEEPS}/{sweep['id']}/resume").json()  # the cancelled child again: a second end
    assert resumed["state"] == "running"
    end_child(settings, ids[3], 0.9)
    assert [entry["event"] for entry in sweep_deliveries(client, server)] == ["sweep.finished"] * 2


def test_of_two_last_children_ending_at_once_exactly_one_finishes_the_sweep(
    client: TestClient, settings: Settings
) -> None:
    """The second end waits on the sweep's lock until the first commits, then finds every child ended."""
    sweep = client.post(SWEEPS, json={"spec": tiny_job("race"), "grid": {"train.lr": [0.01, 0.02]}}).json()
    first, second = (job["id"] for job in sweep["jobs"])
    hook = {"url": "http://127.0.0.1:9/hook", "secret": "s" * 16, "events": ["sweep.finished"]}
    hook_id = client.post(HOOKS, json=hook).json()["id"]
    engine = get_engine(settings.database)
    for job_id in (first, second):
        with Session(engine) as session:
            assert transition(session, job_id, STARTING, ["queued"], worker="w")
            assert transition(session, job_id, RUNNING, [STARTING])
            session.commit()

    def end_second() -> None:
        with Session(engine) as session:
            assert transition(session, second, SUCCEEDED, [RUNNING])
            session.commit()

    with Session(engine) as session:
        assert transition(session, first, SUCCEEDED, [RUNNING])
        other = threading.Thread(target=end_second)
        other.start()
        other.join(timeout=1.0)
        assert other.is_alive()  # it waits for this end's transaction
        session.commit()
    other.join(timeout=30)
    assert not other.is_alive()
    assert [(entry["event"], entry["job_id"]) for entry in sweep_deliveries(client, hook_id)] == [
        ("sweep.finished", second)
    ]
