"""The benchmarks page's generated sections equal the report of their committed records, byte for byte,
and every record they name is committed and quiet."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipebd_core.bench.page import budget_text, record_paths, regenerate
from pipebd_core.bench.recovery import RecoveryRecord, render_recovery
from pipebd_core.bench.report import load_record
from pipebd_core.documents.tradeoff_record import TradeoffRecord
from tests.helpers import pipebd_here

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"


def test_the_page_is_its_records_report() -> None:
    text = PAGE.read_text()
    assert record_paths(text), "docs/benchmarks.md has no section generated from records"
    assert regenerate(text, ROOT) == text, "run `pipebd bench --update-page docs/benchmarks.md` and commit"


def test_the_page_shows_only_quiet_records_of_distillation_and_training() -> None:
    files = [ROOT / path for paths in record_paths(PAGE.read_text()) for path in paths]
    records = [load_record(file) for file in files if "benchmark" not in json.loads(file.read_text())]  # bench.json
    assert {record.phase for record in records} == {"distill", "finetune"}
    shared = [(r.name, arm.name) for r in records for arm in r.arms for run in arm.runs if run.load.shared]
    shared += [(r.name, "T1") for r in records for run in r.bound.runs if run.load.shared]
    assert shared == [], f"arms measured on a busy machine: {shared}"


def test_the_comparison_benchmark_renders_its_result_file() -> None:
    text = PAGE.read_text()
    assert ["benchmarks/records/compare-500.json"] in record_paths(text)
    record = json.loads((ROOT / "benchmarks/records/compare-500.json").read_text())
    for result in record["results"]:
        for key in ("api", "page"):
            assert f"{result[key]['p50_ms']:.1f} / {result[key]['p95_ms']:.1f} ms" in text
        assert not result["load"]["shared"], f"{result['database']} was measured on a busy machine"
        assert f"{result['database']} {result['load']['other_cores']:.3f} cores (quiet)" in text
    assert record["machine"]["cpu_model"] in text


def test_the_shaped_link_benchmark_renders_its_result_file_and_was_measured_alone() -> None:
    text = PAGE.read_text()
    assert ["benchmarks/records/shaped-link.json"] in record_paths(text)
    record = json.loads((ROOT / "benchmarks/records/shaped-link.json").read_text())
    assert {arm["mode"] for arm in record["arms"]} >= {"auto", "dp"}
    for arm in record["arms"]:
        assert not arm["load"]["shared"], f"{arm['mode']} was measured on a busy machine"
        assert f"| {arm['measured_step_s'] * 1e3:.1f} ms |" in text


def test_update_page_rewrites_a_stale_section_and_refuses_a_page_without_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # the records a page names are relative to the repository root
    text = PAGE.read_text()
    paths = record_paths(text)[0]
    stale = tmp_path / "page.md"
    stale.write_text(f"# Page\n\n<!-- pipebd bench --report {' '.join(paths)} -->\nold table\n<!-- end of report -->\n")
    code, _, err = pipebd_here("bench", "--update-page", str(stale))
    assert code == 0, err
    assert "old table" not in stale.read_text() and regenerate(stale.read_text(), ROOT) == stale.read_text()
    stale.write_text("# Page without a generated section\n")
    code, _, err = pipebd_here("bench", "--update-page", str(stale))
    assert code != 0 and "no generated section" in err


def test_the_tradeoff_record_renders_its_budgets_and_was_measured_quiet() -> None:
    text = PAGE.read_text()
    assert ["benchmarks/records/tiny-llama-tradeoff.json"] in record_paths(text)
    record = TradeoffRecord.from_json(json.loads((ROOT / "benchmarks/records/tiny-llama-tradeoff.json").read_text()))
    assert not record.shared, "a part of the trade-off record was measured on a busy machine"
    assert record.rows[0].budget is None and len(record.rows) >= 4  # the teacher, then the budgets
    for row in record.rows[1:]:
        assert f"| {budget_text(row.budget)} | {', '.join(row.layers)} | {row.perplexity:.2f} |" in text
    own = [row for row in record.rows if row.budget == record.search_budget]
    assert own and own[0].layers == record.search_layers  # the search's own budget, chosen again: its choice


def arm_speedup(record: str, arm: str) -> str:
    """The `vs dp` figure (e.g. `4.14x`) of `arm` in the page's generated report of `record`."""
    text = PAGE.read_text()
    section = text.split(f"<!-- pipebd bench --report benchmarks/records/{record} -->", 1)[1]
    section = section.split("<!-- end of report -->", 1)[0]
    row = next(line for line in section.splitlines() if line.startswith(f"| {arm} |"))
    return re.split(r"(?<!\\)\|", row)[6].split()[0]  # cells split at pipes a plan does not escape


@pytest.mark.parametrize(
    ("workload", "record", "arm"),
    [
        ("the VGG-16 compression", "vgg16-dsconv.json", "auto"),
        ("the NAS supernet", "nas-mobilenetv2-cifar.json", "auto"),
        ("the tiny Llama (where `tr_dpu` measured", "tiny-llama-text.json", "tr_dpu"),
        ("the tiny Llama", "tiny-llama-text.json", "auto"),
        ("the tiny ViT", "tiny-vit-digits.json", "auto"),
    ],
)
def test_the_readme_headline_gives_the_pages_measured_speedups(workload: str, record: str, arm: str) -> None:
    readme = " ".join((ROOT / "README.md").read_text().split())  # its line breaks as spaces
    figure = arm_speedup(record, arm)
    if arm == "auto":
        assert f"{figure} for {workload}" in readme, f"the README should say {figure} for {workload} ({record})"
    else:
        assert f"{workload} {figure})" in readme, f"the README should say {workload} {figure} ({record})"


def test_the_recovery_benchmark_renders_its_record_measured_alone_within_its_bounds() -> None:
    text = PAGE.read_text()
    assert ["benchmarks/records/recovery.json"] in record_paths(text)
    record = RecoveryRecord.model_validate_json((ROOT / "benchmarks/records/recovery.json").read_text())
    assert not record.load.shared, f"measured on a busy machine: {record.load}"
    assert render_recovery(record) in text
    kills = [run for run in record.runs if run.event == "kill"]
    notices = [run for run in record.runs if run.event == "preempt"]
    assert kills and notices and all(run.nodes_after == 1 for run in record.runs)  # went on with the node left
    assert all(run.steps_lost == 0 and run.outcome == "preempted" for run in notices)
    assert all(run.steps_lost <= record.checkpoint_every and run.outcome == "requeued" for run in kills)
