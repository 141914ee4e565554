"""Browser tier: the job page's memory and utilisation charts and the NAS heat maps, in Chromium
against the real app (uvicorn) reading telemetry rows as a worker stores them (no job runs here).

Memory is drawn as memory in use per rank, with each rank's peak as a companion series; NVML's GPU
utilisation joins the busy share where the lines carry it; each chart has a collapsed table of its
latest values (the text equivalent of hovering over it) that follows new lines while open; each NAS
block's heat map shows its updates over time with candidate names, gains a column live when an
update arrives on the event stream (keeping what the reader opened), and can be reached with the
keyboard.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session

from app.core.database import get_engine
from app.core.settings import Settings
from app.core.tables import Job
from app.main import create_app
from pipebd_core.documents.phases import DISTILL
from pipebd_core.documents.telemetry import DistillLine
from pipebd_core.rundir import RunDir
from tests.service.conftest import make_settings
from tests.service.factories import insert_job, store_lines
from tests.service.live import serve
from tests.telemetry_lines import distill_line
from tests.web.browser import PHONE, watched_page

pytestmark = pytest.mark.timeout(300)
MIB = 2**20
LINES = 12  # telemetry lines per rank in the history
SEVEN = [1 / 7] * 7  # a layer that may be skipped: 6 MBConv candidates and zero


def leaning(lead: int, p: float, count: int = 7) -> list[float]:
    return [p if index == lead else (1 - p) / (count - 1) for index in range(count)]


def line(rank: int, seq: int, arch: dict[int, list[list[float]] | None] | None = None) -> DistillLine:
    return distill_line(
        rank,
        seq - 1,
        time=1000.0 + seq + 0.1 * rank,
        round="weights" if arch is None else "arch",
        blocks=[rank],
        loss={rank: 1.0 / seq} if arch is None else {},
        phases={"teacher": 0.2, "student": 0.5, "recv_wait": 0.3 * rank},
        # memory in use goes up and down (a saw tooth); the peak only rises
        cur_mem=(100 + 10 * rank + (seq % 4) * 20) * MIB,
        peak_mem=(100 + 10 * rank + min(seq, 4) * 20) * MIB,
        gpu_util=50 + 5 * rank + seq,
        done=seq,
        total=100,
        arch=arch,
    )


def store(settings: Settings, job_id: int, lines: list[DistillLine]) -> None:
    store_lines(settings, job_id, lines, {"progress": 0.2, "samples_per_s": 10.0})


@pytest.fixture(scope="module")
def nas_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, Settings]]:
    folder: Path = tmp_path_factory.mktemp("telemetry")
    settings = make_settings(folder, f"sqlite:///{folder / 'pipebd.db'}", stale_after_s=3600)
    app = create_app(settings)
    job = insert_job(settings, "running", started_at=1000.0, heartbeat_at=time.time() + 3600)
    assert job.id is not None
    with Session(get_engine(settings.database)) as session:
        stored = session.get(Job, job.id)
        assert stored is not None
        stored.spec = {**stored.spec, "workload": {"kind": "nas"}}
        session.add(stored)
        session.commit()
    history = [line(rank, seq) for seq in range(1, LINES + 1) for rank in (0, 1)]
    history += [line(0, LINES + 1, {0: [SEVEN]}), line(0, LINES + 2, {0: [leaning(0, 0.4)]})]
    store(settings, job.id, history)
    with serve(app) as url:
        yield url, job.id, settings


# JobTelemetry itself, imported by the page: which series each field feeds
SERIES_OF_RECORDS = """async () => {
    const { JobTelemetry } = await import('/static/js/telemetry.js');
    const t = new JobTelemetry({ startedAt: 0, numBlocks: 1, nproc: 1 });
    const base = { rank: 0, step: 0, blocks: [0], loss: { 0: 1 }, phases: { teacher: 0.5 }, samples: 4 };
    t.addRecords([
        { ...base, time: 1, done: 1, cur_mem: 300 * 2 ** 20, peak_mem: 300 * 2 ** 20, gpu_util: 80 },
        { ...base, time: 2, done: 2, cur_mem: 100 * 2 ** 20, peak_mem: 300 * 2 ** 20 },
    ]);
    return { memory: [t.memory.keys, t.memory.data()], util: [t.util.keys, t.util.data()] };
}"""


def open_values(page: Any, chart: str) -> list[list[str]]:
    """Opens the chart's "Latest values" with the keyboard; the rows of its table, cell by cell."""
    page.focus(f"#chart-{chart}-values summary")
    page.keyboard.press("Enter")
    page.wait_for_selector(f"#chart-{chart}-values[open]:not([data-rows='0'])")
    return values_of(page, chart)


def open_job_page(page: Any, job_id: int) -> None:
    page.goto(f"/jobs/{job_id}")
    page.wait_for_selector("body[data-ready='1']")


def values_of(page: Any, chart: str) -> list[list[str]]:
    rows: list[list[str]] = page.locator(f"#chart-{chart}-values tbody tr").evaluate_all(
        "rows => rows.map(row => [...row.cells].map(cell => cell.textContent))"
    )
    return rows


def test_memory_in_use_and_its_peak_per_rank_and_gpu_utilization(
    browser: Any, nas_job: tuple[str, int, Settings]
) -> None:
    url, job_id, settings = nas_job
    with watched_page(browser, url) as watched:
        page = watched.page
        open_job_page(page, job_id)
        memory = page.locator("#chart-memory")
        assert int(memory.get_attribute("data-points") or 0) == 2 * (2 * LINES + 2)  # in use and peak, every line
        legend = memory.locator(".u-legend").inner_text()
        for label in ("rank 0", "rank 0 peak", "rank 1", "rank 1 peak"):
            assert label in legend, legend
        assert "Memory in use per rank" in memory.locator("figcaption").inner_text()
        util = page.locator("#chart-util .u-legend").inner_text()
        assert "GPU util rank 0" in util and "GPU util rank 1" in util, util
        series = page.evaluate(SERIES_OF_RECORDS)
        keys, (xs, *columns) = series["memory"]
        assert keys == ["rank 0", "rank 0 peak"] and xs == [1, 2]
        assert columns == [[300, 100], [300, 300]]  # in use falls back, the peak stays
        keys, (xs, *columns) = series["util"]
        assert keys == ["rank 0", "GPU util rank 0"] and columns[1] == [0.8, None]  # a line without NVML: a gap
        # each chart's text equivalent: a collapsed table of the latest values, opened with the keyboard.
        # Rank 0's latest line is its second architecture update (line 14), rank 1's its line 12.
        assert page.locator(".chart-values[open]").count() == 0
        assert open_values(page, "memory") == [["rank 0", "140 MiB", "180 MiB"], ["rank 1", "110 MiB", "190 MiB"]]
        assert open_values(page, "util") == [["rank 0", "70%", "64%"], ["rank 1", "70%", "67%"]]  # 0.7 s busy a second
        assert open_values(page, "loss") == [["block 0", "11", "0.08333"], ["block 1", "11", "0.08333"]]  # 1 / 12
        throughput = open_values(page, "throughput")
        assert [row[0].split(" (")[0] for row in throughput][:2] == ["latest", "average since the start"]
        assert all(re.fullmatch(r"\d+(\.\d)?", row[1]) for row in throughput), throughput
        store(settings, job_id, [line(1, LINES + 1)])  # rank 1's next line, live: the open tables follow
        page.wait_for_function("document.querySelector('#chart-memory-values tbody').textContent.includes('130 MiB')")
        assert values_of(page, "loss")[1] == ["block 1", "12", "0.07692"]  # 1 / 13
        assert values_of(page, "util")[1] == ["rank 1", "70%", "68%"]
        page.set_viewport_size(PHONE)
        page.wait_for_timeout(300)
        assert watched.overflow() == 0
        watched.screenshot("job-latest-values-390")
        assert watched.errors == []


def test_nas_heat_maps_show_candidate_history_grow_live_and_take_the_keyboard(
    browser: Any, nas_job: tuple[str, int, Settings]
) -> None:
    url, job_id, settings = nas_job
    with watched_page(browser, url) as watched:
        page = watched.page
        open_job_page(page, job_id)
        section = page.locator("#part-architecture")
        assert section.is_visible()
        steps = page.locator("#arch-0-wrap thead th.step")
        assert steps.all_text_contents() == ["step 12", "step 13"]  # "step " for screen readers only
        choice = page.locator("#arch-0-wrap td.choice").inner_text()
        assert choice == "mbconv_k3_e3 40%", choice
        page.click("#arch-0-latest summary")  # the reader opens every candidate's probability
        assert page.locator("#arch-0-latest th.mono").all_inner_texts()[-1] == "zero"
        store(settings, job_id, [line(0, LINES + 3, {0: [leaning(6, 0.6)]})])  # a new update, live
        page.wait_for_function("document.querySelectorAll('#arch-0-wrap thead th.step').length === 3", timeout=30_000)
        assert page.locator("#arch-0-wrap td.choice").inner_text() == "zero 60%"
        title = page.locator("#arch-0-wrap td.other").get_attribute("title")
        assert title == "step 13: zero 10.0%; mbconv_k3_e3 led with 40.0%"
        assert page.locator("#arch-0-latest").evaluate("details => details.open") is True  # kept open
        assert page.evaluate("document.body.dataset.ready") == "1"  # no reload
        region = page.locator("#arch-0-wrap")
        assert region.get_attribute("role") == "region"
        assert page.locator(f"#{region.get_attribute('aria-labelledby')}").inner_text().startswith("Block 0")
        for _ in range(120):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.id") == "arch-0-wrap":
                break
        else:
            raise AssertionError("the heat map cannot be reached with the Tab key")
        watched.screenshot("job-nas-1280")
        page.set_viewport_size(PHONE)
        page.wait_for_timeout(300)
        assert watched.overflow() == 0
        watched.screenshot("job-nas-390")
        assert watched.errors == []


@pytest.fixture(scope="module")
def short_job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """A finished 15 s job whose distillation took 60 ms at its 10th second (a tiny language model: most of
    the job is start-up), with block losses near 1.4e-5, and a progress bar redrawn with carriage returns
    in its distillation's log."""
    folder: Path = tmp_path_factory.mktemp("short")
    settings = make_settings(folder, f"sqlite:///{folder / 'pipebd.db'}")
    app = create_app(settings)
    run = RunDir(folder / "run")
    run.log(0, DISTILL).parent.mkdir(parents=True)
    run.log(0, DISTILL).write_bytes(PROGRESS_LOG)  # rank 0's: the log the panel opens on
    job = insert_job(settings, "succeeded", started_at=1000.0, finished_at=1015.0, progress=1.0, run_dir=str(run.root))
    assert job.id is not None
    lines = [
        distill_line(
            rank, step, time=1010.10 + 0.01 * step, loss={rank: (1.2 + 0.05 * step) * 1e-5}, blocks=[rank],
            phases={"teacher": 0.004, "student": 0.005}, samples=5, cur_mem=64 * MIB, peak_mem=80 * MIB,
            done=step + 1, total=7,
        )
        for step in range(7)
        for rank in (0, 1)
    ]  # fmt: skip
    store(settings, job.id, lines)
    with serve(app) as url:
        yield url, job.id


PROGRESS_LOG = b"starting\n  0% loss nan\r 50% loss 1.2e-05\r100% loss 1.4e-05\r\nwrote the students\n"


def test_a_short_job_s_charts_have_points_on_its_own_time_axis_readable_small_labels_and_last_state_logs(
    browser: Any, short_job: tuple[str, int]
) -> None:
    url, job_id = short_job
    with watched_page(browser, url) as watched:
        page = watched.page
        open_job_page(page, job_id)
        page.wait_for_selector("#chart-throughput[data-drawn]:not([data-drawn='0'])")
        page.wait_for_selector("#chart-loss[data-y-labels]")
        # the samples/s of seven 10 ms tasks per rank: several windows, each a point, not one lone value
        assert int(page.locator("#chart-throughput").get_attribute("data-drawn") or 0) >= 3
        # busy and memory on the job's time axis: from its start to its end, 15 s, not 10.10-10.16 s
        for chart in ("throughput", "util", "memory"):
            low, high = map(float, (page.locator(f"#chart-{chart}").get_attribute("data-x-range") or "").split("|"))
            assert low == 0 and high >= 15, (chart, low, high)
        labels = (page.locator("#chart-loss").get_attribute("data-y-labels") or "").split("|")
        shown = [label for label in labels if label]
        assert len(set(shown)) == len(shown), labels  # no two ticks read the same
        nonzero = [float(label) for label in shown if float(label) != 0]
        assert len(nonzero) >= 2 and all(1e-6 < value < 1e-4 for value in nonzero), labels
        # the log panel shows a carriage-return progress line as its last state
        page.wait_for_function("document.getElementById('log-text').textContent.includes('wrote the students')")
        log = page.locator("#log-text").text_content() or ""
        assert log.splitlines() == ["starting", "100% loss 1.4e-05", "wrote the students"], log
        watched.screenshot("job-short-1280")
        assert watched.errors == []
