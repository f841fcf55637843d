"""The runtime layer under real DDP: torchrun --nproc_per_node=2 on CPU/gloo, plain torch and transformers+peft.

Each job runs many combinations (see tests/runtime_cases/); with NBDDP_OUTCOME_DIR set, the jobs also leave the
JSON that tools/ddp_outcome_table.py turns into the table in docs/runtime.md.
"""
import json
import os
import sys

import pytest
import torch

from e2e import run_at_once, torchrun_launch

pytestmark = pytest.mark.ddp
CASES = os.path.join(os.path.dirname(__file__), "runtime_cases")
SAME = "trains, same weights as one process"


def _env(env=None, drop=()):
    return {k: v for k, v in {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}.items() if k not in drop}


def _run_at_once(launches, timeout=240):
    """Independent cases, (argv, env) each, all at once in CASES (e2e.run_at_once: none reads time): [(the finished
    process, its RESULT lines)], in that order."""
    return [(done, [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")])
            for done in run_at_once([(argv, CASES, env) for argv, env in launches], timeout)]


def torchrun_argv(script, *args, env=None):
    return torchrun_launch(os.path.join(CASES, script), 2, _env(env), script_args=args)


def _key(r):
    return (r["ckpt"], r["static"], r["find_unused"], r["tiled"], r["unused"])


@pytest.fixture(scope="module")
def cases():
    """The DDP cases without and with the layer, and the start-up sync without and with it: four jobs at once."""
    launches = {"matrix": torchrun_argv("ddp_cases.py", "matrix"), "layer": torchrun_argv("ddp_cases.py", "layer"),
                "sync plain": torchrun_argv("sync_case.py", "plain"), "sync layer": torchrun_argv("sync_case.py", "layer")}
    return dict(zip(launches, _run_at_once(launches.values())))


@pytest.fixture(scope="module")
def matrix(cases):
    done, results = cases["matrix"]
    assert len(results) == 96, done.stdout[-2000:] + done.stderr[-3000:]
    return {_key(r): r for r in results}


@pytest.fixture(scope="module")
def layered(cases):
    done, results = cases["layer"]
    assert len(results) == 16, done.stdout[-2000:] + done.stderr[-3000:]
    return done, results


def test_reentrant_lora_find_unused_fails_without_layer(matrix):
    assert matrix[("reentrant", False, True, "none", False)]["outcome"] == "error: marked ready twice"
    assert matrix[("unsloth", False, True, "none", False)]["outcome"] == "error: marked ready twice"


def test_static_graph_with_late_parameter_fails_without_layer(matrix):
    assert matrix[("none", True, False, "none", True)]["outcome"] == "error: graph has changed"
    assert matrix[("reentrant", True, False, "none", True)]["outcome"] == "error: graph has changed"


def test_tiled_mlp_chunked_backward_fails_without_layer(matrix):
    assert matrix[("none", False, False, "zoo", False)]["outcome"] == "error: marked ready twice"


def test_last_chunk_design_fails_with_find_unused(matrix):
    # why the layer returns the summed chunk gradients through the node instead (docs/runtime.md, TiledMLP)
    assert matrix[("none", False, False, "last-chunk", False)]["outcome"] == SAME
    assert matrix[("none", False, True, "last-chunk", False)]["outcome"] == "error: marked ready twice"


def test_reference_runs_are_exact_where_ddp_copes(matrix):
    # the comparison itself can fail: a configuration that trains must also match one process
    ok = [r for r in matrix.values() if not r["outcome"].startswith("error")]
    assert ok and all(r["outcome"] == SAME for r in ok)


def test_layer_trains_every_case_with_one_process_weights(layered):
    done, results = layered
    bad = [r for r in results if r["outcome"] != SAME]
    assert not bad, bad
    # float64, 3 SGD steps: 2-rank DDP equals one process on the global batch within rtol 1e-9, atol 1e-10
    assert max(r["max_abs_diff"] for r in results) < 1e-10


def test_layer_uses_each_strategy_and_says_why(layered):
    done, results = layered
    chosen = {(r["ckpt"], r["unused"]): (r["static"], r["find_unused"]) for r in results
              if not r.get("applied")}  # the lazy case forces static_graph=True; tiled or not, the choice is one
    # every parameter used: find_unused_parameters=False is the cure; static graph stays off (it broke with
    # Unsloth's checkpointing on 2 GPUs: bench/results/notebooks-2026-11-26.json)
    assert chosen[("reentrant", False)] == (False, False)
    assert chosen[("unsloth", False)] == (False, False)
    assert chosen[("non-reentrant", False)] == (False, False)
    assert chosen[("none", True)] == (False, True)
    assert chosen[("reentrant", True)] == (False, True)  # swapped to non-reentrant + CPU offload, see below
    lazy = [r for r in results if r.get("applied")]
    assert [r["applied"] for r in lazy] == ["lazily"] and lazy[0]["outcome"] == SAME
    out = done.stdout
    assert ("nbddp: DDP static_graph=False, find_unused_parameters=False (reentrant gradient checkpointing, "
            "every trainable parameter used)") in out
    assert "switched to non-reentrant checkpointing" in out
    assert "nbddp: unsloth_zoo TiledMLP made DDP-safe" in out
    assert "DDP static_graph" not in done.stderr


def test_offload_checkpointing_trains_where_reentrant_fails(matrix, layered):
    # reentrant / Unsloth-style offloaded checkpointing + find_unused_parameters=True: ready-twice without the
    # layer; the layer's non-reentrant save_on_cpu checkpointing trains with the same find_unused_parameters
    _, results = layered
    for ckpt in ("reentrant", "unsloth"):
        assert matrix[(ckpt, False, True, "none", True)]["outcome"] == "error: marked ready twice"
        swapped = [r for r in results if r["ckpt"] == ckpt and r["unused"]]
        assert swapped and all(r["find_unused"] and r["outcome"] == SAME for r in swapped)


@pytest.fixture(scope="module")
def trainer_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trainer")
    launches = {
        "nolayer": torchrun_argv("trainer_case.py", "nolayer", str(tmp / "nolayer.pt")),
        "layer": torchrun_argv("trainer_case.py", "layer", str(tmp / "layer.pt")),  # the notebook's batch kept
        # each rank accumulates the case's 2 micro-batches (NBDDP_BATCH=scale: DDP's own semantics)
        "accumulate": torchrun_argv("trainer_case.py", "accumulate", str(tmp / "accumulate.pt"),
                                    env={"NBDDP_BATCH": "scale"}),
        "single": ([sys.executable, os.path.join(CASES, "trainer_case.py"), "single", str(tmp / "single.pt")],
                   _env(drop=("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"))),
    }
    return tmp, dict(zip(launches, _run_at_once(launches.values())))


def test_trainer_reentrant_lora_fails_without_layer(trainer_runs):
    _, runs = trainer_runs
    done, res = runs["nolayer"]
    assert res and res[0]["outcome"] == "error: marked ready twice", done.stderr[-3000:]


def test_trainer_with_layer_matches_one_process_with_kept_global_batch(trainer_runs):
    tmp, runs = trainer_runs
    done, res = runs["layer"]
    assert res and res[0]["outcome"] == "trains", done.stderr[-3000:]
    assert res[0]["static_graph"] is False and res[0]["find_unused_parameters"] is False
    assert res[0]["gradient_accumulation_steps"] == 1  # 2 on one process -> 1 on each of 2
    assert "nbddp: 2 processes keep the notebook's batch of 4: gradient_accumulation_steps 2 -> 1 per rank" in \
        done.stdout
    single_done, single = runs["single"]
    assert single and single[0]["outcome"] == "trains", single_done.stderr[-3000:]
    assert single[0]["max_change"] > 1e-3  # the weights moved, so equality means something
    a, b = torch.load(tmp / "layer.pt"), torch.load(tmp / "single.pt")
    assert a.keys() == b.keys() and a
    for k in a:  # float32, 3 SGD steps on a global batch of 4
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-5)


def test_gradients_are_reduced_once_per_optimizer_step_under_accumulation(trainer_runs):
    _, runs = trainer_runs
    done, res = runs["accumulate"]
    assert res and res[0]["outcome"] == "trains", done.stderr[-3000:]
    assert res[0]["gradient_accumulation_steps"] == 2
    assert res[0]["reductions"] == 3  # 3 optimizer steps of 2 micro-batches: the first of each skips the all-reduce


@pytest.mark.parametrize("mode", ["plain", "layer"])
def test_start_up_sync_gives_every_rank_rank0_state(cases, mode):
    # rank 1 starts from other values: after DDP is built, every rank must hold rank 0's parameters (trainable,
    # frozen, non-contiguous) and buffers, with the layer's tensor-by-tensor sync as with DDP's packed one
    done, results = cases[f"sync {mode}"]
    assert len(results) == 1, done.stdout[-2000:] + done.stderr[-3000:]
    result = results[0]
    assert result["synced"] == {"trained": True, "frozen": True, "transposed": True, "table": True}
    assert result["contiguous_after"] is False  # synced in place: the parameter is the same tensor
    if mode == "plain":
        assert result["packed_broadcasts"] >= 1
    else:
        assert result["packed_broadcasts"] == 0  # no packed copy: DDP's own sync did not run


@pytest.fixture(scope="module")
def balance_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("balance")
    modes = {"balanced": {"NBDDP_BATCH": "scale"},  # balancing on by default; 2 micro-batches a rank
             "drawn": {"NBDDP_BALANCE_LENGTHS": "0", "NBDDP_BATCH": "scale"}}
    runs = {}
    ran = _run_at_once([torchrun_argv("balance_case.py", str(tmp / f"{mode}.pt"), env=env) for mode, env in modes.items()])
    for mode, (done, _) in zip(modes, ran):
        seen = [json.loads((tmp / f"{mode}.pt.rank{r}.json").read_text()) if (tmp / f"{mode}.pt.rank{r}.json").exists()
                else None for r in (0, 1)]
        runs[mode] = (done, seen, tmp / f"{mode}.pt")
    return runs


def _steps(seen, accumulation=2):
    """Per optimizer step: the samples of both ranks, and each rank's padded tokens."""
    out = []
    for s in range(len(seen[0]) // accumulation):
        micro = [rank[s * accumulation:(s + 1) * accumulation] for rank in seen]
        out.append((sorted(i for rank in micro for m in rank for i in m["ids"]),
                    [sum(m["shape"][0] * m["shape"][1] for m in rank) for rank in micro]))
    return out


def test_length_balanced_ranks_keep_each_step_and_the_weights(balance_runs):
    (done, seen, pt), (off_done, off_seen, off_pt) = balance_runs["balanced"], balance_runs["drawn"]
    assert done.returncode == 0 and off_done.returncode == 0, done.stderr[-3000:] + off_done.stderr[-3000:]
    assert "nbddp: length-balanced ranks:" in done.stdout
    assert "length-balanced ranks" not in off_done.stdout
    steps, off_steps = _steps(seen), _steps(off_seen)
    assert len(steps) == len(off_steps) == 4
    assert [ids for ids, _ in steps] == [ids for ids, _ in off_steps]  # each step trains on the same samples
    assert [m["ids"] for m in seen[0]] != [m["ids"] for m in off_seen[0]]  # ... dealt out differently
    slowest, off_slowest = sum(max(t) for _, t in steps), sum(max(t) for _, t in off_steps)
    assert slowest < off_slowest  # the rank that sets each step's pace pads and computes less
    a, b = torch.load(pt), torch.load(off_pt)
    assert a.keys() == b.keys() and a
    for k in a:  # float32, 4 SGD steps: the same gradients up to floating-point order
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-5)
