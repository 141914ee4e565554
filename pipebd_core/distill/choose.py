"""Choose again: a finished transformer search's network for another budget, from the candidate library it
kept, without training anything and without launching a rank (Puzzletron's `--mip-only`).

    python -m pipebd_core.distill.choose --run-dir DIR --params 0.4 --kv-cache 0.25

The search trained every candidate of every layer and recorded each one's held-out loss and costs in
architecture.json; its distill phase's last checkpoints hold every candidate's weights. Choosing again
solves the choice for the new budget from that record (workloads/library.py, the same two functions the
search's own choice went through, so the same budget gives the same architecture), takes the chosen
candidates' trained weights from those checkpoints, and writes choices/<n>/: choice.json, architecture.json,
searched_model.pt, distilled_state.pt and, for a language model, searched_hf/ (a Hugging Face
model directory). A budget no choice meets is refused with the smallest fraction
the candidates reach, as the plan phase refuses it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from torch import nn

from pipebd_core.distill.finalize import check_final_checkpoints, load_final_students
from pipebd_core.distill.plan import Plan
from pipebd_core.documents.architecture import Architecture
from pipebd_core.documents.choice import ChoiceRecord
from pipebd_core.rank.metrics import perplexity
from pipebd_core.rundir import RunDir
from pipebd_core.spec import Budget, Spec, SpecError
from pipebd_core.workloads.candidates import Candidates
from pipebd_core.workloads.library import MEASURES, choose_from, chosen_architecture, library_of
from pipebd_core.workloads.workload import Workload, build_workload


def check_search(run_dir: RunDir, spec: Spec) -> Architecture:
    """The architecture.json of a finished transformer search, or a SpecError saying what is missing."""
    if spec.workload.kind != "transformer" or len(spec.workload.replacements) < 2:
        raise SpecError(
            f"job {spec.name!r} is not a transformer search (workload.kind {spec.workload.kind!r},"
            f" {len(spec.workload.replacements)} replacement(s)): only a search keeps a library to choose from"
        )
    if not run_dir.architecture.exists():
        raise SpecError(f"{run_dir.architecture} is missing: the search's finalize phase has not run")
    return Architecture.from_json(json.loads(run_dir.architecture.read_text()))


def chosen_network(run_dir: RunDir, workload: Workload, picks: list[int]) -> nn.Module:
    """The network of the chosen candidates, their weights as the distill phase trained them."""
    total = Plan.from_document(run_dir.load_plan()).step_plan.total
    check_final_checkpoints(run_dir, workload.num_blocks, total)
    students, _ = load_final_students(run_dir, workload, total)
    assert workload.teacher_network is not None, "a transformer workload has its teacher network"
    teacher = workload.teacher_network()
    assert isinstance(teacher, nn.Sequential), "the teacher network is its blocks, then the head"
    candidates = [student for student in students if isinstance(student, Candidates)]
    layers = [student.chosen(pick) for student, pick in zip(candidates, picks, strict=True)]
    return nn.Sequential(*layers, teacher[-1]).eval()


def next_index(run_dir: RunDir) -> int:
    taken = [int(path.name) for path in run_dir.choices.glob("*") if path.name.isdigit()]
    return max(taken, default=0) + 1


def choose_again(run_dir: RunDir, budget: Budget | None) -> ChoiceRecord:
    """Solve the choice for `budget` from the search's library, build and evaluate its network, write it."""
    started = time.perf_counter()
    spec = run_dir.load_spec()
    library = library_of(check_search(run_dir, spec), MEASURES[spec.workload.search_loss])
    picks, chosen_by = choose_from(library, budget)
    architecture = chosen_architecture(library, picks, budget, chosen_by)
    workload = build_workload(spec)
    network = chosen_network(run_dir, workload, picks)
    folder = run_dir.choice(next_index(run_dir))
    folder.root.mkdir(parents=True)
    run_dir.write_json(folder.architecture, architecture.to_json())
    torch.save(network, folder.searched_model)
    torch.save(network.state_dict(), folder.distilled_state)
    if workload.hf_directory is not None:  # a language model: for transformers too (workloads/hf_directory.py)
        workload.hf_directory(network, architecture, folder.searched_hf)
    record = ChoiceRecord(
        index=int(folder.root.name),
        budget=None if budget is None else budget.fractions(),
        layers=[block.layers[0] for block in architecture.blocks],
        chosen_by=chosen_by,
        reached=architecture.reached or {},
        perplexity=perplexity(network, spec, torch.device("cpu")),
        seconds=time.perf_counter() - started,
    )
    run_dir.write_json(folder.record, record.to_json())
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m pipebd_core.distill.choose", description=__doc__.split("\n")[0])
    parser.add_argument("--run-dir", required=True, help="the run directory of a finished transformer search")
    for name in ("params", "kv-cache", "latency"):
        parser.add_argument(f"--{name}", type=float, help=f"budget: {name} as a fraction of the teacher's layers")
    args = parser.parse_args(argv)
    fractions = {"params": args.params, "kv_cache": args.kv_cache, "latency": args.latency}
    given = {name: value for name, value in fractions.items() if value is not None}
    try:
        record = choose_again(RunDir(Path(args.run_dir)), Budget(**given) if given else None)
    except (SpecError, ValueError) as error:
        raise SystemExit(f"pipebd choose: {error}") from None
    print(json.dumps(record.to_json()))


if __name__ == "__main__":
    main()
