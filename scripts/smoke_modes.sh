#!/usr/bin/env bash
# Runs a bundled example in every mode at 1, 2 and 4 ranks through `pipebd run` and prints one line
# per run (exit code, wall time). Minutes on a small CPU machine, so it is not part of `make test`.
#   scripts/smoke_modes.sh [SPEC] [OUT]     default: examples/vgg16-dsconv.yaml into runs/smoke
set -u
cd "$(dirname "$0")/.."
spec=${1:-examples/vgg16-dsconv.yaml}
out=${2:-runs/smoke}
blocks=$(.venv/bin/python -c "
from pipebd_core.spec import load_spec
from pipebd_core.workloads.workload import build_workload
print(build_workload(load_spec('$spec')).num_blocks)")
mkdir -p "$out"
for n in 1 2 4; do
  for mode in dp ls ir tr tr_dpu hybrid auto; do
    extra=()
    if [ "$mode" = hybrid ]; then
      # the first block replicated on every rank but one (on all of them at 1 rank), the rest on the last
      if [ "$n" = 1 ]; then stages="[{start: 0, stop: $blocks, replicas: 1}]"
      else stages="[{start: 0, stop: 1, replicas: $((n - 1))}, {start: 1, stop: $blocks, replicas: 1}]"; fi
      extra=(--set "schedule.stages=$stages")
    fi
    started=$(date +%s)
    .venv/bin/pipebd run "$spec" --nproc "$n" --mode "$mode" --out "$out/$mode-$n" "${extra[@]}" \
      > "$out/$mode-$n.log" 2>&1
    code=$?
    echo "$mode nproc=$n exit=$code wall=$(( $(date +%s) - started ))s"
    rm -f "$out/$mode-$n/compressed_model.pt"  # hundreds of MB per run
  done
done
