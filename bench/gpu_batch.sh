#!/usr/bin/env bash
# One device call of the notebook table (issue 5), run from the repo root on the GPU machine with .whl and
# .gpurun carried: installs the wheels and builds the offline hub once per machine (both stay in /tmp while the
# machine is warm), records the GPUs and versions, then `bench/run_notebooks.py run --out $OUT "$@"`, resuming
# from the last call's results on the same machine (/tmp/nbrun/last.json): runs done there are not repeated.
#   bash bench/gpu_batch.sh --modes ddp --deadline 460
#   bash bench/gpu_batch.sh --single-slots 2 --deadline 460
set -u
if [ ! -f /tmp/site/.nbddp-wheels ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    touch /tmp/site/.nbddp-wheels
fi
export PYTHONPATH=/tmp/site HF_HOME=/tmp/hf HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,memory.total --format=csv > "$OUT/gpus.csv"
python3 - > "$OUT/versions.txt" <<'PY'
from importlib.metadata import version
for name in ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "unsloth", "unsloth_zoo", "bitsandbytes"):
    print(name, version(name))
PY
if [ ! -f /tmp/hf/offline_hub.json ]; then
    python3 bench/offline_hub.py --home /tmp/hf > "$OUT/hub.log" 2>&1 || { tail -40 "$OUT/hub.log"; exit 1; }
fi
cp /tmp/hf/offline_hub.json "$OUT/"
mkdir -p /tmp/nbrun
python3 bench/run_notebooks.py run --scripts .gpurun --out "$OUT" --resume /tmp/nbrun/last.json "$@"
rc=$?
cp "$OUT/notebooks.json" /tmp/nbrun/last.json  # the next call on this warm machine resumes from here
exit $rc
