#!/usr/bin/env bash
# The digits pipeline on CPU, in minutes: train a VGG-11 teacher on scikit-learn's digits, compress it
# under `dp` and under `auto` (each with a fine-tune phase), then print their accuracy table: teacher,
# distilled and fine-tuned top-1, parameters, FLOPs, wall time per phase.
#   scripts/digits_pipeline.sh [OUT]      default OUT: runs (the teacher goes to OUT/digits-teacher)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs}
teacher="$out/digits-teacher"
if [ ! -f "$teacher/teacher.pt" ]; then
  rm -rf "$teacher"
  .venv/bin/pipebd run examples/digits-teacher.yaml --out "$teacher"
fi
for mode in dp auto; do
  rm -rf "$out/digits-$mode"
  .venv/bin/pipebd run examples/digits-compress.yaml --mode "$mode" --out "$out/digits-$mode" \
    --set "workload.teacher_weights=$teacher/teacher.pt"
  rm -f "$out/digits-$mode/compressed_model.pt"  # hundreds of MB that the table does not need
done
.venv/bin/python - "$teacher" "$out/digits-dp" "$out/digits-auto" <<'PY'
import json
import sys
from pathlib import Path


def summary(folder: str) -> dict:
    return json.loads((Path(folder) / "summary.json").read_text())


def seconds(phases: dict, *names: str) -> str:
    return " + ".join(f"{name} {phases[name]:.0f} s" for name in names if phases.get(name) is not None)


teacher = summary(sys.argv[1])["finetune"]
print("| run | teacher top-1 | distilled top-1 | fine-tuned top-1 | params | FLOPs/sample | wall time |")
print("|---|---|---|---|---|---|---|")
print(
    f"| teacher (vgg11_bn, ddp) | {teacher['top1_after']:.3f} | – | – | {teacher['student']['params']:,} |"
    f" {teacher['student']['flops'] / 1e6:.0f} M | {seconds(teacher['phase_s'], 'finetune')} |"
)
for folder in sys.argv[2:]:
    report = summary(folder)
    tune, phases = report["finetune"], report["finetune"]["phase_s"]
    mode = json.loads((Path(folder) / "spec.json").read_text())["schedule"]["mode"]
    print(
        f"| compressed, {mode} then {tune['strategy']} | {tune['teacher_top1']:.3f} | {tune['top1_before']:.3f} |"
        f" {tune['top1_after']:.3f} | {tune['student']['params']:,} | {tune['student']['flops'] / 1e6:.0f} M |"
        f" {seconds(phases, 'profile', 'distill', 'finalize', 'profile_finetune', 'finetune', 'evaluate')} |"
    )
PY
