#!/usr/bin/env bash
# One device call of the T4-class Kaggle figures (kind nvidia-h100-x2, run from the repository root, carrying .whl
# and .gpurun, where .gpurun/bench is this bench/ and .gpurun/<slug>.py the converted scripts):
#   bash .gpurun/bench/t4_batch.sh TAG BUDGET_S SLUG ROUNDS FIRST_ROUND [SMS SHARE [NCCL_CUMEM]]
# Without SMS: bench/t4_class.py probes the share first (green contexts while the offline hub builds, then MPS)
# and picks N and the mechanism. Then bench/kaggle_t4.py runs SLUG at 15 GiB per GPU, `one+whole,self` for ROUNDS
# rounds (order rotated), each run 5 optimizer steps (the rate over steps 3-5), stopping before BUDGET_S seconds.
# Then, in what is left of BUDGET_S: T4_KGB=KGB_SLUG (a script run with the notebook's batch kept, the default) runs `one,self` on
# the whole GPUs, 8 steps, the losses to compare step by step; T4_SPLIT=SLUG:GIB runs `self` at GIB free per GPU
# (where the model must split over both) on the share.
# $OUT gets: machine.txt, hub.log, t4-probe-*-TAG.json, t4-SLUG-TAG.json, [kgb-TAG.json, split-TAG.json,]
# t4-logs-TAG.tar.gz.
tag=$1 budget=$2 slug=$3 rounds=$4 first=$5 sms=${6:-} share=${7:-mps} cumem=${8:-}
t0=$(date +%s)
root=$PWD
export NCCL_NVLS_ENABLE=0
mkdir -p /tmp/t4 && ln -sfn "$root/.gpurun/bench" /tmp/t4/bench && ln -sfn "$root/.whl" /tmp/t4/.whl \
    && ln -sfn "$root/nbddp" /tmp/t4/nbddp && cd /tmp/t4 || exit 1
stop_mps() { python3 bench/t4_class.py stop-mps >/dev/null 2>&1 || true; }
trap stop_mps EXIT
if [ -z "$sms" ]; then  # green contexts need no daemon: probe them while the hub builds
    python3 bench/t4_class.py probe --phase green --out "$OUT/t4-probe-green-$tag.json" > /tmp/probe-green.log 2>&1 &
fi
source bench/gpu_env.sh --models llama31,llama32_3b --datasets unsloth/alpaca-cleaned,mlabonne/FineTome-100k \
    --layers llama31=32 --layers llama32_3b=28 --text-scale 3 --max-rows 1200 || exit 1
echo "setup done at $(( $(date +%s) - t0 )) s"
if [ -z "$sms" ]; then
    wait
    cat /tmp/probe-green.log
    python3 bench/t4_class.py probe --phase mps --out "$OUT/t4-probe-mps-$tag.json"
    read -r sms share cumem < <(python3 - "$OUT/t4-probe-mps-$tag.json" "$OUT/t4-probe-green-$tag.json" <<'PY'
import json, os, sys
mps, green = (json.load(open(f)) if os.path.exists(f) else {} for f in sys.argv[1:])
cumem = "NCCL_CUMEM_ENABLE=0" if mps.get("mps_nccl", {}).get("returncode") else "-"
if mps.get("mps_valid"):
    print(mps["mps_chosen_sms"], "mps", cumem)
elif green.get("green_valid", {}).get("8"):
    print(8, "green", "-")
else:
    print("none none -")
PY
)
    echo "probe: sms=$sms share=$share nccl=$cumem at $(( $(date +%s) - t0 )) s"
    [ "$sms" = none ] && { echo "no valid share: stopping"; exit 0; }
fi
extra=()
[ -n "$cumem" ] && [ "$cumem" != - ] && extra=(--env "$cumem")
left=$(( budget - ($(date +%s) - t0) - 15 ))
python3 bench/kaggle_t4.py --script "$root/.gpurun/$slug.py" --gib 15 --runs one+whole,self --rounds "$rounds" \
    --first-round "$first" --sms "$sms" --share "$share" --skip 1 --timeout 240 --deadline "$left" \
    --env NBDDP_BENCH_ARGS=max_steps=5 --env NBDDP_BENCH_EXIT_AFTER_TRAIN=1 "${extra[@]}" \
    --work "/tmp/kaggle-t4-$tag" --out "$OUT/t4-$slug-$tag.json" 2>&1 | grep -v "^\s*$" | tail -40
steps=(--skip 1 --env NBDDP_BENCH_EXIT_AFTER_TRAIN=1 "${extra[@]}")
if [ -n "${T4_KGB:-}" ]; then
    left=$(( budget - ($(date +%s) - t0) - 15 ))
    python3 bench/kaggle_t4.py --script "$root/.gpurun/$T4_KGB.py" --gib 15 --runs one,self --timeout 200 \
        --deadline "$left" --env NBDDP_BENCH_ARGS=max_steps=8 "${steps[@]}" --work "/tmp/kaggle-t4-$tag/kgb" \
        --out "$OUT/kgb-$tag.json" 2>&1 | grep -o '"run": "[a-z]*"\|"losses": \[[^]]*\]\|"returncode": [0-9]*'
fi
if [ -n "${T4_SPLIT:-}" ]; then
    left=$(( budget - ($(date +%s) - t0) - 15 ))
    python3 bench/kaggle_t4.py --script "$root/.gpurun/${T4_SPLIT%%:*}.py" --gib "${T4_SPLIT##*:}" --runs self \
        --sms "$sms" --share "$share" --timeout 240 --deadline "$left" --env NBDDP_BENCH_ARGS=max_steps=5 "${steps[@]}" \
        --work "/tmp/kaggle-t4-$tag/split" --out "$OUT/split-$tag.json" 2>&1 | tail -2 | cut -c1-600
fi
(cd /tmp && find "kaggle-t4-$tag" \( -name '*.log' -o -path '*/probe/*.json' \) -print0 \
    | tar -czf "$OUT/t4-logs-$tag.tar.gz" --null -T - /tmp/probe-green.log 2>/dev/null)
echo "done at $(( $(date +%s) - t0 )) s"
