"""The launch steps that build a network or load a data set, and so run in a child process of a process that
supervises jobs (job/isolated.py): the preflight (data set, workload, plans without a profile), the `plan`
phase (plan.json), the `plan_finetune` phase (finetune_plan.json) and a distill phase's re-plan from its
calibrated profile (job/replan.py: the new plan document, which the supervisor writes with its history).

`python -m pipebd_core.job.steps --folder FOLDER` runs the step FOLDER/request.json names (StepRequest) and
writes FOLDER/answer.json (StepAnswer: what it raised, or what it gave back). A one-shot command (`pipebd
run`) calls `run` in its own process.
"""

from __future__ import annotations

import argparse
import json
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipebd_core.documents.errors import PlanError
from pipebd_core.documents.phases import PLAN, PLAN_FINETUNE
from pipebd_core.documents.step import StepAnswer, StepName, StepRequest
from pipebd_core.finetune.recut import recut_checkpoints
from pipebd_core.job.isolated import ANSWER, REQUEST
from pipebd_core.planning.distill_planner import resolve_plan
from pipebd_core.planning.finetune_planner import check_labels, resolve_train_plan
from pipebd_core.rank.network import build_network, finetune_view
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Spec, SpecError, parse_spec


def preflight(spec: Spec) -> None:
    """The launch checks that need no profile and no earlier phase: data set, workload, the distillation
    plan (`auto`, which plans from a profile, is checked as `ir`, one of its candidates that runs wherever
    the batch splits over nproc; a latency budget is left to the plan phase) and the finetune plan on a
    freshly initialised network (strategy `auto` as `gpipe` or `ddp`, partitioners that plan from the
    profile as `pipedream`; a searched network exists only after its search: only its data is checked).
    Raises SpecError or PlanError naming what to change."""
    document = spec.model_dump(mode="json")
    document["schedule"]["profile"] = False
    budget = document["workload"].get("budget")
    if budget and budget.get("latency") is not None:  # measured by that profile: checked at the plan phase
        rest = {name: value for name, value in budget.items() if name != "latency" and value is not None}
        document["workload"]["budget"] = rest or None
    if document["schedule"]["mode"] == "auto":
        document["schedule"].update(mode="ir", stages=None, replan=None)
    tune = document.get("finetune")
    if tune is not None and tune["strategy"] == "auto":  # the same stand-ins for the end-to-end training
        tune.update(strategy="gpipe" if tune["stages"] else "ddp", profile=False)
    if tune is not None and tune["partitioner"] in ("layerpipe", "auto"):  # they plan from the profile
        tune.update(partitioner="pipedream", profile=False)
    try:
        if spec.workload.kind != "train":
            resolve_plan(parse_spec(document), None)
        if spec.finetune is not None and spec.workload.kind != "nas":
            resolve_train_plan(parse_spec(document), None)
        elif spec.finetune is not None:
            check_labels(finetune_view(spec))
    except (SpecError, PlanError):
        raise
    except Exception as error:  # user factories may raise anything; say which and why
        raise SpecError(
            f"workload: building the workload or data set failed: {type(error).__name__}: {error}"
        ) from None


def plan(run_dir: RunDir, spec: Spec) -> None:
    """The `plan` phase: plan.json, from the profile where the spec profiles."""
    profile = run_dir.load_profile() if spec.schedule.profile else None
    budget = spec.workload.budget
    if budget is not None and budget.latency is not None:  # known once the profile measured the candidates
        from pipebd_core.workloads.transformer import check_latency_budget

        check_latency_budget(spec, profile)
    run_dir.write_json(run_dir.plan, resolve_plan(spec, profile).to_json())


def plan_finetune(run_dir: RunDir, spec: Spec) -> None:
    """The `plan_finetune` phase: finetune_plan.json; a plan made again (a job resumed on another rank count)
    whose stages differ from those the checkpoints were saved under re-cuts them for the new stages
    (finetune/recut.py)."""
    measured = run_dir.load_layer_profile() if run_dir.layer_profile.exists() else None
    earlier = run_dir.load_finetune_plan() if run_dir.finetune_plan.exists() else None
    plan = resolve_train_plan(spec, run_dir, measured)
    folder = run_dir.finetune_checkpoints
    if earlier is not None and list(earlier.stages) != list(plan.stages) and folder.root.exists():
        step = recut_checkpoints(folder, build_network(spec, run_dir), list(earlier.stages), list(plan.stages))
        was = {"from_strategy": earlier.strategy, "from_stages": earlier.stages}
        run_dir.append_event("finetune_recut", step=step, **was, strategy=plan.strategy, stages=plan.stages)
    run_dir.write_json(run_dir.finetune_plan, plan.to_json())


def replan(run_dir: RunDir, spec: Spec) -> dict[str, Any]:
    """A distill phase's re-plan: the plan resolved from the profile calibrated by the run's calibration.json,
    as plan.json's document (the supervisor adds the re-plan's history and writes it: job/replan.py)."""
    calibrated = run_dir.load_profile().calibrated(run_dir.load_calibration())
    return resolve_plan(spec, calibrated).document().to_json()


RUN_DIR_STEPS: dict[str, Callable[[RunDir, Spec], dict[str, Any] | None]] = {
    PLAN: plan,
    PLAN_FINETUNE: plan_finetune,
    "replan": replan,
}


def run(step: StepName, spec: Spec, run_dir: RunDir | None) -> dict[str, Any] | None:
    """Run `step` here; what it gives back (the re-plan's plan document), if anything."""
    if step == "preflight":
        preflight(spec)
        return None
    assert run_dir is not None, f"the {step} step needs a run directory"
    return RUN_DIR_STEPS[step](run_dir, spec)


def answer(request: StepRequest) -> StepAnswer:
    """Run the requested step; what it raised, as the answer (its traceback goes to the step's log)."""
    try:
        spec = parse_spec(request.spec)
        result = run(request.step, spec, RunDir(Path(request.run_dir)) if request.run_dir is not None else None)
    except Exception as error:  # every failure goes back to the parent, which raises it
        traceback.print_exc()
        return StepAnswer(error=type(error).__name__, message=str(error))
    return StepAnswer(result=result)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipebd_core.job.steps", description=__doc__)
    parser.add_argument("--folder", type=Path, required=True, help=f"holds {REQUEST}; {ANSWER} is written there")
    folder = parser.parse_args(argv).folder
    request = StepRequest.from_json(json.loads((folder / REQUEST).read_text()))
    (folder / ANSWER).write_text(json.dumps(answer(request).to_json()))  # read once this process has ended


if __name__ == "__main__":
    main()
