#!/usr/bin/env bash
# What only a GPU can show, in one table, in a few minutes on one GPU (no GPU: exit 2; any failed row: 1):
# a 1-rank CUDA job of each bundled example (profiled on the GPU: CUDA-event timing, the profiler's
# CUDA peak memory, NVML utilisation lines in the telemetry) and SyncBatchNorm on a CUDA student.
#   scripts/gpu_check.sh [OUT]        default OUT: runs/gpu-check (the table is also in OUT/gpu_check.json)
# It needs only the repository: it uses .venv when `make setup` made one, else a python3 that already has
# torch with CUDA (a GPU node's image), adding the engine's few pure-Python needs from .whl/*.whl when
# they are carried there (machines without a network) or from PyPI.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/gpu-check}
mkdir -p "$out"

python=""
for candidate in .venv/bin/python python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    python=$candidate
    break
  fi
done
if [ -z "$python" ]; then
  if ! python3 -c 'import torch' 2>/dev/null; then
    make setup || exit 1
    python=.venv/bin/python
  else
    echo "gpu_check: torch sees no CUDA device here; run this on a machine with a GPU" >&2
    exit 2
  fi
fi

needs="pydantic yaml psutil pynvml"
missing=$("$python" -c "
import importlib.util, sys
print(' '.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))" $needs)
if [ -n "$missing" ]; then
  site=$(mktemp -d /tmp/pipebd-site.XXXXXX)
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$python" -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl || exit 1
  else
    "$python" -m pip install -q --target "$site" pydantic pyyaml psutil nvidia-ml-py || exit 1
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
exec "$python" scripts/gpu_check.py "$out"
