"""Choosing again: a finished transformer search's network for another budget, from its kept candidate
library, without training. Tier: two tiny Llama searches through the supervisor (the same seed, spec and
candidates; budgets A and B): A is test_hf_directories.py's search (`finished_run` runs it once for both files;
chosen from in a copy here, as the shared run is only read), B the same spec at budget B, stopped after
finalize (its fine-tuning is not read); the choice made again from A's library for budget B must be the
architecture that B's own search chose, with the same trained weights, and choosing starts no process."""

from __future__ import annotations

import json
import multiprocessing
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from pipebd_core.distill.choose import choose_again, main
from pipebd_core.documents.phases import FINALIZE
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Budget, SpecError, parse_spec
from tests.transformer_specs import LLAMA_SEARCH_BUDGET, llama_search_document

BUDGET_A, BUDGET_B = LLAMA_SEARCH_BUDGET, {"params": 0.8, "kv_cache": 0.5}


@pytest.fixture(scope="module")
def runs(
    shared_text: Path, tmp_path_factory: pytest.TempPathFactory, finished_run: Callable[..., RunDir]
) -> tuple[RunDir, RunDir]:
    shared = finished_run(parse_spec(llama_search_document(shared_text, BUDGET_A)))
    copy = tmp_path_factory.mktemp("search-a") / "run"
    shutil.copytree(shared.root, copy)
    searched_b = finished_run(parse_spec(llama_search_document(shared_text, BUDGET_B)), until=FINALIZE)
    return RunDir(copy), searched_b


def architecture(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def test_choosing_budget_b_from_a_search_at_budget_a_gives_b_s_own_search(
    runs: tuple[RunDir, RunDir], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    searched_a, searched_b = runs

    def no_process(*args: object, **kwargs: object) -> None:
        raise AssertionError("choosing again started a process")

    monkeypatch.setattr(subprocess, "Popen", no_process)
    monkeypatch.setattr(multiprocessing.Process, "start", no_process)
    record = choose_again(searched_a, Budget(**BUDGET_B))
    folder = searched_a.choice(record.index)
    mine, theirs = architecture(folder.architecture), architecture(searched_b.architecture)
    assert mine == theirs  # the chosen layers, every candidate's record, how it was chosen, what it reached
    assert architecture(searched_a.architecture)["blocks"] != theirs["blocks"]  # budget A chose otherwise
    assert record.layers == [block["layers"][0] for block in theirs["blocks"]] and record.budget == BUDGET_B
    ours = torch.load(folder.distilled_state, weights_only=True)
    reference = torch.load(searched_b.distilled_state, weights_only=True)
    assert ours.keys() == reference.keys()
    for name, tensor in reference.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=0, msg=name)
    assert record.perplexity is not None and record.perplexity > 1.0


def test_a_budget_on_a_cost_the_search_did_not_measure_is_refused_and_writes_nothing(
    runs: tuple[RunDir, RunDir],
) -> None:
    searched_a, _ = runs
    before = sorted(searched_a.choices.glob("*")) if searched_a.choices.exists() else []
    with pytest.raises(SpecError, match=r"workload.budget.latency: this search recorded no latency cost"):
        choose_again(searched_a, Budget(latency=0.5))
    after = sorted(searched_a.choices.glob("*")) if searched_a.choices.exists() else []
    assert after == before  # nothing half-written


def test_the_command_takes_the_run_directory_as_text_and_prints_its_record(
    runs: tuple[RunDir, RunDir], capsys: pytest.CaptureFixture[str]
) -> None:
    searched_a, searched_b = runs
    budget = ["--params", str(BUDGET_B["params"]), "--kv-cache", str(BUDGET_B["kv_cache"])]
    main(["--run-dir", str(searched_a.root), *budget])  # what the service runs
    record = json.loads(capsys.readouterr().out)
    assert record["layers"] == [block["layers"][0] for block in architecture(searched_b.architecture)["blocks"]]
    with pytest.raises(SystemExit, match=r"^pipebd choose: .*latency"):
        main(["--run-dir", str(searched_a.root), "--latency", "0.5"])
