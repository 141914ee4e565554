"""Pure logic of sweeps: a search's children (grid order, lists, seeded draws within their ranges), the
refusals of a bad search, `pipebd sweep`'s request body, a sweep's state from its children's, and the best
child of an objective."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from app.cli.main import build_parser
from app.cli.remote import sweep_body
from app.core.objectives import FROM_SUMMARY, Best, best_of
from app.core.sweeps import sweep_state
from app.services.search import MAX_CHILDREN, Objective, SearchError, SweepRequest, children
from pipebd_core.documents.summary import FinetuneReport, ModelSize, Summary
from pipebd_core.spec import SpecError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny-custom.yaml"
BASE = {"name": "base", "train": {"lr": 0.05, "epochs": 1}, "schedule": {"mode": "dp"}}


def test_a_grid_varies_its_first_field_slowest_and_leaves_the_base_alone() -> None:
    request = SweepRequest.model_validate({"spec": BASE, "grid": {"train.lr": [1, 2], "schedule.mode": ["ir", "tr"]}})
    made = children(request)
    assert [child.overrides for child in made] == [
        {"train.lr": 1, "schedule.mode": "ir"},
        {"train.lr": 1, "schedule.mode": "tr"},
        {"train.lr": 2, "schedule.mode": "ir"},
        {"train.lr": 2, "schedule.mode": "tr"},
    ]
    assert made[3].document == {"name": "base", "train": {"lr": 2, "epochs": 1}, "schedule": {"mode": "tr"}}
    assert BASE["train"] == {"lr": 0.05, "epochs": 1}  # the base spec is copied, never changed
    assert request.search() == {"grid": {"train.lr": [1, 2], "schedule.mode": ["ir", "tr"]}}


def test_a_list_makes_a_child_per_mapping_creating_sections() -> None:
    request = SweepRequest.model_validate({"spec": BASE, "list": [{}, {"workload.options.width": 8}]})
    made = children(request)
    assert [child.document.get("workload") for child in made] == [None, {"options": {"width": 8}}]
    assert request.kind == "list" and request.search() == {"list": [{}, {"workload.options.width": 8}]}


def test_random_draws_stay_in_their_ranges_and_repeat_with_the_seed() -> None:
    fields = {"train.lr": {"min": 1e-4, "max": 1e-1, "log": True}, "train.epochs": {"min": 1, "max": 3}}
    request = SweepRequest.model_validate({"spec": BASE, "random": {"count": 200, "seed": 5, "fields": fields}})
    made = [child.overrides for child in children(request)]
    assert all(1e-4 <= item["train.lr"] <= 1e-1 for item in made)
    assert {item["train.epochs"] for item in made} == {1, 2, 3}  # whole numbers between whole bounds
    assert sum(item["train.lr"] < 1e-2 for item in made) > 100  # log-uniform: two decades of three below 1e-2
    assert made == [child.overrides for child in children(request)]
    other = SweepRequest.model_validate({"spec": BASE, "random": {"count": 200, "seed": 6, "fields": fields}})
    assert made != [child.overrides for child in children(other)]


@pytest.mark.parametrize(
    ("search", "message"),
    [
        ({}, "give exactly one search of grid, list, random; got none"),
        ({"grid": {"train.lr": [1]}, "random": {"count": 1, "fields": {"train.lr": [1]}}}, "got grid, random"),
        ({"grid": {"train.lr": []}}, "grid.`train.lr`\n  List should have at least 1 item"),
        ({"random": {"count": 1, "fields": {"train.lr": []}}}, "`train.lr`.list.*\n  List should have at least 1"),
        ({"grid": {f"train.f{n}": [1, 2] for n in range(11)}}, f"the grid makes 2048 children; at most {MAX_CHILDREN}"),
        ({"random": {"count": 1, "fields": {"train.lr": {"min": 2, "max": 1}}}}, "max 1 is below min 2"),
        ({"random": {"count": 1, "fields": {"train.lr": {"min": 0, "max": 1, "log": True}}}}, "needs min > 0"),
        ({"grid": {"train.lr": [1]}, "max_parallel": "2"}, "Input should be a valid integer"),  # strict
    ],
)
def test_a_bad_search_is_refused_saying_what_would_work(search: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SweepRequest.model_validate({"spec": BASE, **search})


def test_an_override_that_is_not_a_field_path_is_refused_where_it_was_given() -> None:
    for overrides, loc in (({"train..lr": [1]}, ["grid", "train..lr"]), ({"train.lr.x": [1]}, ["grid", "train.lr.x"])):
        with pytest.raises(SearchError) as refused:
            children(SweepRequest.model_validate({"spec": BASE, "grid": overrides}))
        assert refused.value.loc == loc
    with pytest.raises(SearchError) as refused:
        children(SweepRequest.model_validate({"spec": BASE, "list": [{}, {"1x": 2}]}))
    assert refused.value.loc == ["list", 1, "1x"] and "is not a dotted field path" in str(refused.value)


def test_pipebd_sweep_arguments_make_the_request_body() -> None:
    parser = build_parser()
    spec = ["sweep", str(EXAMPLE)]
    grid = ["--grid", "train.lr=0.01,0.05", "--grid", "schedule.mode=dp,ir"]
    body = sweep_body(
        parser.parse_args(
            [*spec, *grid, "--set", "train.epochs=2", "--max-parallel", "2", "--objective", "final_loss:minimize"]
        )
    )
    assert body["grid"] == {"train.lr": [0.01, 0.05], "schedule.mode": ["dp", "ir"]}
    assert body["spec"]["train"]["epochs"] == 2 and body["max_parallel"] == 2 and "name" not in body
    assert body["objective"] == {"metric": "final_loss", "goal": "minimize"}
    drawn = sweep_body(
        parser.parse_args(["sweep", "examples/tiny-custom.yaml", "--grid", "train.lr=1,2", "--random", "3"])
    )
    assert drawn["random"] == {"count": 3, "seed": 0, "fields": {"train.lr": [1, 2]}} and "grid" not in drawn
    with pytest.raises(SpecError, match="expected METRIC:GOAL"):
        sweep_body(parser.parse_args([*spec, "--grid", "a.b=1", "--objective", "loss"]))
    with pytest.raises(SpecError, match=r"expected dotted\.path=value,value"):
        sweep_body(parser.parse_args([*spec, "--grid", "train.lr"]))


@pytest.mark.parametrize(
    ("states", "expected"),
    [
        (["queued", "queued"], "queued"),
        (["succeeded", "queued"], "running"),
        (["paused", "running"], "running"),
        (["paused", "succeeded"], "paused"),
        (["succeeded", "failed", "cancelled"], "failed"),
        (["succeeded", "cancelled"], "cancelled"),
        (["succeeded", "succeeded"], "succeeded"),
    ],
)
def test_a_sweeps_state_comes_from_its_childrens(states: list[str], expected: str) -> None:
    assert sweep_state(states) == expected


def test_the_best_child_is_the_lowest_or_highest_known_value() -> None:
    values: dict[int, float | None] = {4: 0.5, 2: None, 7: 0.2, 9: 0.9, 3: 0.2}
    assert best_of(values, Objective(metric="final_loss", goal="minimize")) == Best(3, 0.2)  # the older on a tie
    assert best_of(values, Objective(metric="student_top1", goal="maximize")) == Best(9, 0.9)
    assert best_of({1: None}, Objective(metric="final_loss", goal="minimize")) is None


def test_each_summary_metric_reads_its_field() -> None:
    summary = Summary(name="s", final_loss={0: 0.5, 1: 1.5}, student_top1=0.75, student_perplexity=12.5)
    assert {metric: read(summary) for metric, read in FROM_SUMMARY.items()} == {
        "final_loss": 1.0,
        "student_top1": 0.75,
        "finetune_top1": None,
        "perplexity": 12.5,
        "finetune_perplexity": None,
    }
    summary.finetune = FinetuneReport(
        strategy="1f1b", top1_before=None, top1_after=None, perplexity_after=9.5, student=ModelSize(params=1, flops=1)
    )
    assert FROM_SUMMARY["finetune_perplexity"](summary) == 9.5 and FROM_SUMMARY["perplexity"](summary) == 12.5
