# Sourced at the start of a device call (repo root, .whl carried): installs the wheels and builds the offline
# hub once per machine (both stay in /tmp while the machine is warm), exports the environment the launches
# need, and records the GPUs and package versions in $OUT/machine.txt.
#   source bench/gpu_env.sh [offline_hub.py options, e.g. --models llama31,llama32_3b]
if [ ! -f /tmp/site/.nbddp-wheels ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || return 1
    touch /tmp/site/.nbddp-wheels
fi
export PYTHONPATH=/tmp/site HF_HOME=/tmp/hf HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=index,name,uuid,memory.total --format=csv > "$OUT/machine.txt"
python3 - >> "$OUT/machine.txt" <<'PY'
from importlib.metadata import version
for name in ("torch", "transformers", "peft", "accelerate", "trl", "datasets", "unsloth", "unsloth_zoo", "bitsandbytes"):
    print(name, version(name))
PY
# the CPUs as the guest sees them: sockets, cores, hyperthread siblings (two busy processes on siblings share a core)
{ lscpu | grep -E "^(Model name|Socket|Core|Thread|CPU\(s\)|CPU max MHz|NUMA node)"
  echo "thread siblings: $(cat /sys/devices/system/cpu/cpu*/topology/thread_siblings_list 2>/dev/null | sort -uV | paste -sd' ')"; } >> "$OUT/machine.txt"
if [ ! -f /tmp/hf/offline_hub.json ]; then
    python3 bench/offline_hub.py --home /tmp/hf "$@" > "$OUT/hub.log" 2>&1 || { tail -40 "$OUT/hub.log"; return 1; }
fi
export BENCH_MACHINE="$(nvidia-smi --query-gpu=name --format=csv,noheader | paste -sd+)"
