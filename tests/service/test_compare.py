"""Service tier: comparison of 500 jobs through the real API on real databases (SQLite and PostgreSQL),
rows written straight through the models: every page walked in server order, only the spec fields that
differ (or all of them), a sweep's children and a filter as selections, loss min/max/final from telemetry
and summary.json, and problem details for bad input. The dashboard page renders a paged, sorted table."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.core.database import get_engine, migrate
from app.core.queue import queue_name
from app.core.settings import Settings
from app.core.tables import Job, JobMetric, Sweep
from app.main import create_app
from pipebd_core.documents.summary import Summary
from tests.service.factories import tiny_job, write_summary
from tests.telemetry_lines import distill_line

JOBS = 500
SWEEP_CHILDREN = 100
STATES = ("queued", "running", "succeeded", "failed")
LRS = (0.01, 0.02, 0.05)


@dataclass
class Stored:
    client: TestClient
    settings: Settings
    sweep_id: int
    speeds: dict[int, float | None]  # job id -> samples/s
    states: dict[int, str]
    measured: int  # the job with telemetry and a summary


def spec_of(index: int) -> dict[str, Any]:
    return tiny_job(f"cmp-{index:03d}", train={"epochs": 1, "lr": LRS[index % len(LRS)]})


def insert(settings: Settings) -> Stored:
    """500 jobs: names and learning rates differ, the first 100 the children of a sweep; distinct speeds
    (a few jobs unmeasured), and one job with telemetry of two blocks and a summary."""
    migrate(settings.database)
    rng = random.Random(23)
    speeds = rng.sample(range(1000, 100000), JOBS)
    with Session(get_engine(settings.database), expire_on_commit=False) as session:
        sweep = Sweep(name="cmp-sweep", spec=tiny_job(), search={"grid": {"train.lr": list(LRS)}})
        session.add(sweep)
        session.flush()
        assert sweep.id is not None
        jobs = [
            Job(
                name=f"cmp-{index:03d}",
                state=STATES[index % len(STATES)],
                nproc=2,
                queue=queue_name(2),
                spec=spec_of(index),
                samples_per_s=None if index % 50 == 7 else speeds[index] / 10,
                sweep_id=sweep.id if index < SWEEP_CHILDREN else None,
                plan_summary={"num_blocks": 2},
            )
            for index in range(JOBS)
        ]
        session.add_all(jobs)
        session.flush()
        measured = jobs[3].id
        assert measured is not None
        lines = [distill_line(0, step, loss={0: loss, 1: loss * 2}) for step, loss in enumerate((3.0, 1.0, 2.0))]
        session.add_all(
            JobMetric(job_id=measured, rank=0, seq=n + 1, epoch=0, step=n, time=line.time, record=line.to_json())
            for n, line in enumerate(lines)
        )
        stored = (
            {job.id: job.samples_per_s for job in jobs if job.id is not None},
            {job.id: job.state for job in jobs if job.id is not None},
        )
        session.commit()
        sweep_id = sweep.id
    write_summary(settings, measured, Summary(name="cmp-003", final_loss={0: 0.5, 1: 1.5}, student_top1=0.75))
    return Stored(TestClient(create_app(settings)), settings, sweep_id, *stored, measured)


@pytest.fixture
def stored(settings: Settings) -> Iterator[Stored]:
    found = insert(settings)
    with found.client:
        yield found


def pages(client: TestClient, query: str, limit: int) -> list[dict[str, Any]]:
    """Every page of a comparison, following next_offset."""
    found = []
    offset: int | None = 0
    while offset is not None:
        answer = client.get(f"/api/v1/compare?{query}&limit={limit}&offset={offset}")
        assert answer.status_code == 200, answer.text
        page = answer.json()
        assert len(page["data"]) <= limit
        found.append(page)
        offset = page["next_offset"]
    return found


def test_pages_sorted_and_only_what_differs(stored: Stored) -> None:
    walked = pages(stored.client, "sort=-samples_per_s", 200)
    assert [page["offset"] for page in walked] == [0, 200, 400] and {page["total"] for page in walked} == {JOBS}
    rows = [row for page in walked for row in page["data"]]
    assert len(rows) == JOBS and len({row["id"] for row in rows}) == JOBS
    measured = sorted((speed, job_id) for job_id, speed in stored.speeds.items() if speed is not None)
    unmeasured = sorted(job_id for job_id, speed in stored.speeds.items() if speed is None)
    # descending by speed, then the unmeasured (null) jobs last, ties by id descending
    assert [row["id"] for row in rows] == [job_id for _, job_id in reversed(measured)] + unmeasured[::-1]
    assert [row["samples_per_s"] for row in rows[:3]] == [speed for speed, _ in reversed(measured[-3:])]
    # only the name and the learning rate differ across the 500 specs; every row has both
    assert walked[0]["fields"] == walked[0]["differing"] == ["name", "train.lr"]
    assert all(set(row["fields"]) == {"name", "train.lr"} for row in rows)
    by_id = {row["id"]: row for row in rows}
    first = min(by_id)
    assert by_id[first]["fields"] == {"name": "cmp-000", "train.lr": LRS[0]}
    everything = stored.client.get("/api/v1/compare?all_fields=true&limit=5").json()
    assert everything["all_fields"] and {"train.epochs", "schedule.mode", "train.lr"} <= set(everything["fields"])
    assert everything["data"][0]["fields"]["schedule.mode"] == "tr_dpu"
    by_name = stored.client.get("/api/v1/compare?sort=name&limit=3").json()["data"]
    assert [row["name"] for row in by_name] == ["cmp-000", "cmp-001", "cmp-002"]


def test_selections_summaries_and_bad_input(stored: Stored) -> None:
    client = stored.client
    sweep = pages(client, f"sweep_id={stored.sweep_id}&sort=-id", 30)
    assert sweep[0]["total"] == SWEEP_CHILDREN and len(sweep) == 4
    ids = [row["id"] for page in sweep for row in page["data"]]
    assert ids == sorted(ids, reverse=True) and len(ids) == SWEEP_CHILDREN
    assert all(row["sweep_id"] == stored.sweep_id for page in sweep for row in page["data"])
    failed = client.get("/api/v1/compare?state=failed&name=cmp-0&limit=200").json()
    expected = {job_id for job_id, state in stored.states.items() if state == "failed"}
    assert failed["total"] == len([row for row in failed["data"]]) and failed["next_offset"] is None
    assert {row["id"] for row in failed["data"]} == {job_id for job_id in expected if job_id - min(stored.states) < 100}
    # two jobs with the same learning rate: only their names differ
    same = sorted(stored.states)[:4:3]
    picked = client.get(f"/api/v1/compare?ids={same[1]},{same[0]}").json()
    assert picked["total"] == 2 and picked["differing"] == ["name"]
    measured = client.get(f"/api/v1/compare?ids={stored.measured}").json()["data"][0]
    assert measured["loss"] == {
        "0": {"min": 1.0, "max": 3.0, "final": 0.5},
        "1": {"min": 2.0, "max": 6.0, "final": 1.5},
    }
    assert measured["top1"] == 0.75
    unmeasured = client.get(f"/api/v1/compare?ids={same[0]}").json()["data"][0]
    assert unmeasured["loss"] == {} and unmeasured["top1"] is None
    for query, where in (
        ("sort=loss", "sort"),
        ("ids=3,x", "ids"),
        ("ids=,", "ids"),
        ("ids=" + "9" * 5000, "ids"),  # more digits than int() converts
        ("limit=201", "limit"),
        ("offset=-1", "offset"),
        ("state=lost", "state"),
    ):
        answer = client.get(f"/api/v1/compare?{query}")
        assert answer.status_code == 422, query
        problem = answer.json()
        assert problem["errors"][0]["loc"] == ["query", where], (query, problem)
    assert "samples_per_s" in client.get("/api/v1/compare?sort=loss").json()["detail"]
    missing = client.get("/api/v1/compare?sweep_id=999")
    assert missing.status_code == 404 and "sweep 999" in missing.json()["detail"]
    assert client.get("/api/v1/compare?ids=999999").json() | {"fields": None} == {
        "total": 0,
        "offset": 0,
        "limit": 50,
        "next_offset": None,
        "sort": "id",
        "all_fields": False,
        "fields": None,
        "differing": [],
        "data": [],
    }


def test_the_page_shows_more_than_four_jobs_paged_sorted_and_only_what_differs(stored: Stored) -> None:
    client = stored.client
    page = client.get("/compare", params={"sweep_id": stored.sweep_id, "sort": "-id"})
    assert page.status_code == 200, page.text
    html = page.text
    rows = re.findall(r'<tr data-job="(\d+)">', html)
    first = min(stored.states)
    children = sorted((job_id for job_id in stored.states if job_id - first < SWEEP_CHILDREN), reverse=True)
    assert [int(job_id) for job_id in rows] == children[:50]
    assert re.findall(r'<th scope="col" class="spec-field"><a class="sort" href="[^"]+">([^<]+)</a></th>', html) == [
        "name",
        "train.lr",
    ]
    assert "100 jobs, rows 1\N{EN DASH}50" in html and 'rel="next"' in html and 'rel="prev"' not in html
    assert f'href="/compare?sweep_id={stored.sweep_id}&amp;sort=id"' in html  # the Job column sorts ascending next
    following = client.get("/compare", params={"sweep_id": stored.sweep_id, "sort": "-id", "offset": 50}).text
    assert [int(job_id) for job_id in re.findall(r'<tr data-job="(\d+)">', following)] == children[50:]
    assert 'rel="prev"' in following and 'rel="next"' not in following
    everything = client.get("/compare", params={"sweep_id": stored.sweep_id, "all_fields": "true"}).text
    assert "train.epochs" in everything and "Only the fields that differ" in everything
    measured = client.get("/compare", params={"state": STATES[3], "name": "cmp-003"}).text
    assert "0: 1 / 3 / 0.5" in measured and "75.0%" in measured
    ids = ",".join(str(job_id) for job_id in sorted(stored.states)[:6])
    assert len(re.findall(r'<tr data-job="(\d+)">', client.get("/compare", params={"ids": ids}).text)) == 6
    bad = client.get("/compare", params={"state": "lost"})
    assert bad.status_code == 422 and "is not a job state" in bad.text
    assert client.get("/compare", params={"name": "cmp", "sort": "loss"}).status_code == 422


def test_sorts_by_a_spec_field_and_by_summary_values_over_the_whole_selection(stored: Stored) -> None:
    client = stored.client
    rows = [row for page in pages(client, "sort=spec.train.lr", 200) for row in page["data"]]
    by_lr = sorted(stored.states, key=lambda job_id: (LRS[(job_id - min(stored.states)) % len(LRS)], job_id))
    assert [row["id"] for row in rows] == by_lr  # ascending, ties by id, across pages
    first = client.get("/api/v1/compare?sort=-spec.train.lr&limit=2").json()["data"]
    assert [row["fields"]["train.lr"] for row in first] == [LRS[-1]] * 2 and first[0]["id"] > first[1]["id"]
    better, worse = sorted(stored.states)[10], sorted(stored.states)[11]
    write_summary(stored.settings, better, Summary(name="b", final_loss={0: 0.2, 1: 0.4}, student_top1=0.9))
    write_summary(stored.settings, worse, Summary(name="w", final_loss={0: 2.0}))
    by_loss = client.get("/api/v1/compare?sort=final_loss&limit=4").json()["data"]
    assert [row["id"] for row in by_loss[:3]] == [better, stored.measured, worse]  # means 0.3, 1.0, 2.0
    assert by_loss[3]["id"] == min(stored.states)  # the jobs without a summary follow, by id
    by_top1 = client.get("/api/v1/compare?sort=-top1&limit=2").json()["data"]
    assert [(row["id"], row["top1"]) for row in by_top1] == [(better, 0.9), (stored.measured, 0.75)]
    language = sorted(stored.states)[12]  # a language model's summary: perplexity, no top-1
    write_summary(stored.settings, language, Summary(name="l", student_perplexity=12.5, teacher_perplexity=9.0))
    by_perplexity = client.get("/api/v1/compare?sort=perplexity&limit=2").json()["data"]
    assert [(row["id"], row["perplexity"]) for row in by_perplexity] == [(language, 12.5), (min(stored.states), None)]
    shown = client.get("/compare", params={"ids": f"{language},{better},{worse},{stored.measured},{first[0]['id']}"})
    assert '<td class="perplexity">12.50</td>' in shown.text and '<td class="perplexity">—</td>' in shown.text
    typo = client.get("/api/v1/compare?sort=spec.train.lrr")
    assert typo.status_code == 422 and "'spec.train.lrr' is no field of the selected jobs' specs" in typo.text
    page = client.get("/compare", params={"sweep_id": stored.sweep_id, "sort": "spec.train.lr"}).text
    assert f'href="/compare?sweep_id={stored.sweep_id}&amp;sort=-spec.train.lr"' in page  # descending next
    assert f'href="/compare?sweep_id={stored.sweep_id}&amp;sort=final_loss"' in page


def test_a_name_with_nul_is_refused_on_every_database(stored: Stored) -> None:
    answer = stored.client.get("/api/v1/compare", params={"name": "cmp\x00"})
    assert answer.status_code == 422 and answer.json()["errors"][0]["loc"] == ["query", "name"]
    assert stored.client.get("/compare", params={"name": "cmp\x00"}).status_code == 422
