"""Service tier: the sweep pages from the real app on a real SQLite database (TestClient, no browser): the
children table with each child's overrides and objective value, the best job marked, the objective over
time, the bulk buttons for a submit token only, and the links from the jobs list and the job page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.core.database import get_engine
from app.core.settings import Settings
from app.core.tables import Job, Sweep
from app.main import create_app
from pipebd_core.documents.summary import FinetuneReport, ModelSize, Summary
from tests.service.conftest import make_settings
from tests.service.factories import insert_sweep, write_summary

READ_TOKEN = "read-token-0123456789abcdef"


@pytest.fixture
def sqlite_settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, f"sqlite:///{tmp_path / 'pipebd.db'}")


def finetuned(top1: float) -> Summary:
    model = ModelSize(params=10, flops=100.0)
    report = FinetuneReport(strategy="ddp", top1_before=0.1, top1_after=top1, student=model)
    return Summary(name="tiny", finetune=report)


def test_the_sweep_page_shows_each_child_its_objective_and_the_best(sqlite_settings: Settings) -> None:
    overrides = [{"train.lr": 0.01}, {"train.lr": 0.02}, {"train.lr": 0.03}]
    objective = {"metric": "finetune_top1", "goal": "maximize"}
    sweep_id, ids = insert_sweep(sqlite_settings, overrides, objective=objective, max_parallel=2)
    write_summary(sqlite_settings, ids[0], finetuned(0.61))
    write_summary(sqlite_settings, ids[1], finetuned(0.84))
    with TestClient(create_app(sqlite_settings)) as web:
        page = web.get(f"/sweeps/{sweep_id}")
        assert page.status_code == 200
        html = page.text
        rows = re.findall(r'<tr id="child-(\d+)"( class="best")?', html)
        assert rows == [(str(ids[0]), ""), (str(ids[1]), ' class="best"'), (str(ids[2]), "")]
        assert "<code>train.lr=0.02</code>" in html and "maximize finetune_top1" in html
        objectives = re.findall(r'<td data-label="Objective" class="objective">([^<]*)</td>', html)
        assert objectives == ["0.61", "0.84", "—"]
        assert f'<a href="/jobs/{ids[1]}">#{ids[1]}</a> finetune_top1 0.84' in html
        assert 'id="cancel-sweep"' in html and 'id="pause-sweep"' in html and 'id="resume-sweep"' not in html
        assert "3 queued" in html and "<dd>2</dd>" in html  # the counts by state, max_parallel
        part = web.get(f"/sweeps/{sweep_id}/partials/sweep").text
        assert f'<tr id="child-{ids[1]}" class="best"' in part and "<html" not in part
        assert f'href="/sweeps/{sweep_id}">sweep #{sweep_id}</a>' in web.get("/").text  # from the jobs list
        assert f'<a href="/sweeps/{sweep_id}">Its sweep' in web.get(f"/jobs/{ids[0]}").text
        listed = web.get("/sweeps").text
        assert f'<a href="/sweeps/{sweep_id}">Sweep #{sweep_id} tiny-sweep</a>' in listed
        missing = web.get(f"/sweeps/{sweep_id + 1}")
        assert missing.status_code == 404 and "does not exist" in missing.text


def test_a_read_only_token_sees_the_sweep_without_its_buttons(tmp_path: Path) -> None:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'pipebd.db'}", api_tokens=f"{READ_TOKEN}=read")
    sweep_id, _ = insert_sweep(settings, [{"train.lr": 0.01}])
    with TestClient(create_app(settings)) as web:
        web.cookies.set("pipebd_token", READ_TOKEN)
        html = web.get(f"/sweeps/{sweep_id}").text
    assert 'id="child-' in html and "data-sweep=" in html and 'id="cancel-sweep"' not in html


def test_the_sweep_page_draws_its_objective_over_time(sqlite_settings: Settings) -> None:
    objective = {"metric": "finetune_top1", "goal": "maximize"}
    sweep_id, ids = insert_sweep(sqlite_settings, [{"train.lr": 0.01}, {"train.lr": 0.02}], objective=objective)
    with TestClient(create_app(sqlite_settings)) as web:
        assert 'id="objective-chart"' not in web.get(f"/sweeps/{sweep_id}").text  # nothing has ended yet
        for job_id, top1, minutes in ((ids[0], 0.84, 2.0), (ids[1], 0.61, 5.0)):
            write_summary(sqlite_settings, job_id, finetuned(top1))
            with Session(get_engine(sqlite_settings.database)) as session:
                job = session.get(Job, job_id)
                sweep = session.get(Sweep, sweep_id)
                assert job is not None and sweep is not None
                job.state, job.finished_at = "succeeded", sweep.created_at + minutes * 60
                session.add(job)
                session.commit()
        part = web.get(f"/sweeps/{sweep_id}/partials/sweep").text
    points = re.findall(r'<circle class="point( leads)?" cx="[\d.]+" cy="[\d.]+" r="4" data-job="(\d+)">', part)
    assert points == [(" leads", str(ids[0])), ("", str(ids[1]))]
    assert 'class="best-line" d="M ' in part and "over 5.0 minutes; best 0.84" in part
    assert f"job #{ids[1]}: finetune_top1 0.61 at 5.0 min</title>" in part
