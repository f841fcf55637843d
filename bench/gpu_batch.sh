#!/usr/bin/env bash
# One device call of the notebook table (issue 5), run from the repo root on the GPU machine with .whl and
# .gpurun carried: bench/gpu_env.sh (wheels, offline hub, machine.txt), then `bench/run_notebooks.py run --out
# $OUT "$@"`, resuming from the last call's results on the same machine (/tmp/nbrun/last.json): runs done there
# are not repeated.
#   bash bench/gpu_batch.sh --modes ddp --deadline 460
#   bash bench/gpu_batch.sh --single-slots 2 --deadline 460
set -u
source bench/gpu_env.sh --models all || exit 1
mkdir -p /tmp/nbrun
python3 bench/run_notebooks.py run --scripts .gpurun --out "$OUT" --resume /tmp/nbrun/last.json "$@"
rc=$?
cp "$OUT/notebooks.json" /tmp/nbrun/last.json  # the next call on this warm machine resumes from here
exit $rc
