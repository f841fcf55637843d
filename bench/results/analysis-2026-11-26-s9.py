"""Ninth session (2026-11-26) analysis: python bench/results/analysis-2026-11-26-s9.py > bench/results/analysis-2026-11-26-s9.txt"""
import json
import statistics

R = "bench/results/"
CALLS = {1: ("scaling-2026-11-26-s9-call1-3b.json", "3B, machine F"), 2: ("scaling-2026-11-26-s9-call2-3b.json", "3B, machine G"),
         3: ("scaling-2026-11-26-s9-call3-8b.json", "8B, machine G"), 4: ("scaling-2026-11-26-s9-call4-3b.json", "3B, machine G")}


def load(f):
    return json.load(open(R + f))


def rate(row, name):
    return (row.get(name) or {}).get("samples_per_s")


print("# Ninth session (2026-11-26) analysis; made by bench/results/analysis-2026-11-26-s9.py")
print("## 1. samples/s per launch, x the round's 1-GPU run, and the pinned pair against each other")
for call, (f, tag) in CALLS.items():
    row = load(f)["rounds"][0]
    single = rate(row, "single")
    cells = [f"{name} {rate(row, name)} ({rate(row, name) / single:.3f})" for name in row if rate(row, name)]
    print(f"call {call} {tag}: " + "; ".join(cells))
    if rate(row, "ddp-fast-cpus"):
        print(f"    ddp-fast-cpus / single-fast-cpus {rate(row, 'ddp-fast-cpus') / rate(row, 'single-fast-cpus'):.3f}; "
              f"ddp-fast-cpus / ddp {rate(row, 'ddp-fast-cpus') / rate(row, 'ddp'):.3f}; "
              f"single-fast-cpus / single {rate(row, 'single-fast-cpus') / single:.3f}")
print("## 2. peak memory per rank against the 1-GPU run (max over ranks; allocated, reserved)")
for call, (f, tag) in CALLS.items():
    configs = load(f)["configs"]
    print(f"call {call} {tag}: " + "; ".join(f"{k} {v['max_peak_allocated_growth']:+.4f} {v['max_peak_reserved_growth']:+.4f}"
                                             for k, v in configs.items() if k.startswith("ddp")))
print("## 3. the one-core loop's median time (ms) per copy with 1, 2, 4, 8, 16 copies busy at once, before and after each call's launches")
for call, (f, tag) in CALLS.items():
    for when, curve in (load(f).get("host_load_s") or {}).items():
        cells = [f"{n}: {1000 * c['loop_s_median']:.2f} (copies {1000 * min(c['per_copy']):.1f}-{1000 * max(c['per_copy']):.1f})"
                 for n, c in curve.items()]
        print(f"call {call} {when:6s}: " + "; ".join(cells))
print("## 4. the 1-GPU runs of the 3B script on machine G (calls 2 and 4), samples/s")
singles = [(c, n, rate(load(CALLS[c][0])["rounds"][0], n)) for c in (2, 4) for n in ("single", "single-fast-cpus", "single-hog")]
print("; ".join(f"call {c} {n} {r}" for c, n, r in singles if r))
plain = [r for c, n, r in singles if n == "single"]
print(f"'single' {min(plain)}-{max(plain)}: the faster {max(plain) / min(plain):.3f}x the slower")
print("## 5. the busy core beside the 1-GPU run (single-hog): its loop over the timed steps, the host loop before/after, GPU busy")
for call in (1, 2):
    row = load(CALLS[call][0])["rounds"][0]
    for name in ("single", "single-hog"):
        v = row[name]
        print(f"call {call} {name:10s} samples/s {v['samples_per_s']} median step {v['median_step_s']} host_loop_s {v['host_loop_s']} "
              f"hog loop {v.get('hog')} gpu0 busy % {v['gpu_clocks']['0']['busy_pct_mean']}")
print("## 6. nbddp's default DDP over the 1-GPU run, per pair: seventh, eighth and ninth sessions (machines C, D, F, G)")
for shape, s9 in (("8b", ["scaling-2026-11-26-s9-call3-8b.json"]),
                  ("3b", ["scaling-2026-11-26-s9-call1-3b.json", "scaling-2026-11-26-s9-call2-3b.json", "scaling-2026-11-26-s9-call4-3b.json"])):
    got = [x for f in [f"scaling-2026-11-26-s7-{shape}.json", f"scaling-2026-11-26-s8-{shape}.json"] + s9
           for k, v in load(f)["configs"].items() if k.split("[")[0] == "ddp" for x in v["ratios"]]
    print(f"{shape}: {got} median {statistics.median(got):.3f}, {sum(x >= 1.8 for x in got)} of {len(got)} >= 1.8, "
          f"{sum(x >= 1.9 for x in got)} >= 1.9")
print("## 7. seconds per timed step in which a kernel ran on each GPU (busy_s_per_step) and the rest (the GPU waited), per launch")
for call, (f, tag) in CALLS.items():
    for name, v in load(f)["rounds"][0].items():
        if "per_process" in v:
            continue
        step = sum(v["step_s"]) / len(v["step_s"])
        cells = [f"gpu{g} kernels {c['busy_s_per_step']:.3f} waiting {step - c['busy_s_per_step']:.3f}"
                 for g, c in v["gpu_clocks"].items() if c["busy_pct_mean"]]
        print(f"call {call} {tag} {name:16s} mean step {step:.3f}: " + "; ".join(cells))
print("## 8. the unpinned one-core loop (host_loop_s, ms) before and after each launch: range over the session")
loops = [1000 * s for f, _ in CALLS.values() for v in load(f)["rounds"][0].values() for s in v["host_loop_s"]]
print(f"{min(loops):.2f}-{max(loops):.2f} ms over {len(loops)} timings; steal over each launch "
      f"{sorted({v['host_cpu']['steal_pct'] for f, _ in CALLS.values() for v in load(f)['rounds'][0].values()})} %")
print("## 9. figures from earlier sessions that the ninth session's account cites")
pooled = [x for shape in ("8b", "3b") for x in load(f"scaling-2026-11-26-s7-{shape}.json")["configs"]["ddp"]["ratios_to_plain_torchrun"]]
print(f"seventh session, nbddp's DDP / Unsloth's plain torchrun path, same round: {pooled} median {statistics.median(pooled):.3f}")
gc_off = load("scaling-2026-11-26-s8-3b.json")["configs"]["ddp-gc-off[c3]"]["max_peak_allocated_growth"]
print(f"eighth session, ddp-gc-off peak allocated per rank against the 1-GPU run (checkpointing on): {gc_off:+.4f}")
