#!/usr/bin/env bash
# One node's part of a PipeBD job on several nodes (docs/multinode.md), as a batch scheduler starts it on
# every node: Slurm's `srun` (slurm.sbatch) or a Kubernetes Indexed Job (kubernetes.yaml). Node 0 runs the
# job's phases from SPEC; every other node follows node 0's launches through OUT.
#
#   NODE_RANK  this node's number: Slurm's SLURM_NODEID, or Kubernetes' JOB_COMPLETION_INDEX
#   NNODES     how many nodes: Slurm's SLURM_NNODES (else required)
#   RUN_ID     new for every run: Slurm's SLURM_JOB_ID (else required)
#   HEAD       node 0's address as the others reach it (HOST, or HOST:PORT)
#   OUT        the run directory: one folder every node sees at this path (a shared filesystem)
#   SPEC       the job's spec (node 0 only)
#   PIPEBD     the command (default .venv/bin/pipebd, from the checkout this runs in)
set -euo pipefail
NODE_RANK=${NODE_RANK:-${SLURM_NODEID:-${JOB_COMPLETION_INDEX:?set NODE_RANK (or run under srun or an Indexed Job)}}}
NNODES=${NNODES:-${SLURM_NNODES:?set NNODES, the number of nodes}}
RUN_ID=${RUN_ID:-${SLURM_JOB_ID:?set RUN_ID, new for every run}}
: "${HEAD:?set HEAD, the address of node 0}" "${OUT:?set OUT, a folder every node sees}"
read -r -a pipebd <<< "${PIPEBD:-.venv/bin/pipebd}"
spec=()
if [ "$NODE_RANK" = 0 ]; then
  spec=("${SPEC:?set SPEC on node 0: the spec of the job}")
fi
exec "${pipebd[@]}" run "${spec[@]}" --nnodes "$NNODES" --node-rank "$NODE_RANK" \
  --rdzv-endpoint "$HEAD" --rdzv-id "pipebd-$RUN_ID" --out "$OUT"
