"""Service tier: one job's figures are the same wherever they are shown. Telemetry of a 2-rank pipeline is
stored as the worker stores it (its lines, then app/core/figures.store_figures in the same transaction),
on SQLite and PostgreSQL; the job API, the list API, the compare API, the job page and the compare page
then show one samples/s, one busy share and one measured step, the ones pipebd_core/figures.py defines."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from app.core.settings import Settings
from app.web.templating import millis
from pipebd_core.documents.telemetry import DistillLine
from pipebd_core.figures import busy_share, peak_mem, samples_per_s, step_s
from tests.service.factories import insert_job, store_lines
from tests.telemetry_lines import distill_line

BATCH = 10  # the tiny job's batch size


def pipeline(tasks: int = 50) -> dict[int, list[DistillLine]]:
    """Rank 0 runs blocks 0-1 (0.03 s of work and 0.06 s sending per 0.1 s task: busy 90%), rank 1 blocks 2-3
    (0.08 s of work, 0.015 s waiting for input: busy 80%, the bottleneck); more tasks than the window, the
    first one slow (start-up)."""
    lines: dict[int, list[DistillLine]] = {0: [], 1: []}
    for step in range(tasks):
        end = 5.0 + 0.1 * step
        start_up = 5.0 if step == 0 else 0.0
        lines[0].append(
            distill_line(
                0, step, time=end - 0.02, loss={0: 1.0, 1: 1.0}, samples=BATCH, peak_mem=3 << 30,
                phases={"teacher": 0.01 + start_up, "student": 0.02, "send": 0.06}, done=step + 1, total=tasks,
            )
        )  # fmt: skip
        lines[1].append(
            distill_line(
                1, step, time=end, loss={2: 1.0, 3: 1.0}, samples=BATCH, peak_mem=(2 << 30) + step,
                phases={"recv_wait": 0.015, "teacher": 0.02, "student": 0.06}, done=step + 1, total=tasks,
            )
        )  # fmt: skip
    return lines


@pytest.mark.timeout(60)
def test_a_job_s_figures_are_equal_on_the_job_list_and_compare_apis_and_pages(
    client: TestClient, settings: Settings
) -> None:
    job = insert_job(settings, "succeeded", plan_summary={"mode": "tr_dpu", "num_blocks": 4})
    assert job.id is not None
    lines = pipeline()
    for rank_lines in lines.values():
        store_lines(settings, job.id, rank_lines)
    expected_speed = samples_per_s(lines, num_blocks=4)
    assert expected_speed is not None
    expected = {
        "samples_per_s": expected_speed,
        "step_s": step_s(BATCH, expected_speed),
        "busy_share": busy_share(lines),
        "peak_mem": peak_mem(lines),
    }
    assert expected["peak_mem"] == 3 << 30  # past 2**31: a big integer on PostgreSQL too

    detail = client.get(f"/api/v1/jobs/{job.id}").json()
    (listed,) = [row for row in client.get("/api/v1/jobs").json()["data"] if row["id"] == job.id]
    (compared,) = client.get("/api/v1/compare", params={"ids": str(job.id)}).json()["data"]
    for name, value in expected.items():
        assert detail[name] == pytest.approx(value), name
        assert listed[name] == detail[name] and compared[name] == detail[name], name
    # the window leaves the slow first task out: 10 rows of 2 blocks of 4 per 0.1 s, on each rank
    assert detail["samples_per_s"] == pytest.approx(100.0, rel=0.05)

    assert detail["busy_share"] == pytest.approx(0.9, abs=0.01)  # the busiest rank's

    page = client.get(f"/jobs/{job.id}").text
    step = millis(detail["step_s"])
    busiest = f"{100 * detail['busy_share']:.0f}%"
    assert f'<dd id="figure-step">{step}</dd>' in page and f">{busiest}</dd>" in page  # the status part
    assert f"Measured: {step} per step" in page  # the bottleneck part's measured step
    # the sentence quotes the bottleneck rank's busy share, the one its row of the table shows
    assert "Rank 1 (blocks 2\u20133) is the bottleneck: it is busy 80% of the time" in page
    bottleneck_row = re.search(r'<tr class="is-bottleneck">.*?</td>\s*<td>([\d.]+%)</td>', page, re.S)
    assert bottleneck_row is not None and bottleneck_row.group(1) == "80%"
    compare = client.get("/compare", params={"ids": str(job.id)}).text
    row = re.search(rf'<tr data-job="{job.id}">(.*?)</tr>', compare, re.S)
    assert row is not None
    assert f'<td class="step">{step}</td>' in row.group(1) and f'<td class="busy">{busiest}</td>' in row.group(1)
