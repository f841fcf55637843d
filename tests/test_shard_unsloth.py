"""Unsloth's fast decode in the sharded mode (nbddp/runtime/shard.py, docs/sharded.md).

One GPU: Unsloth's 4-bit Llama (offline_hub's Llama-3.1 stand-in at 4 layers, full width), its adapters added,
generates greedily after `for_inference`; then its layers' frozen weights are sharded over a group of one process
(host copies: every block released to its slice and gathered when it runs) and it generates again: the same tokens,
each new token's layers gathered through `_unsloth_block_swap`; without that attribute the same generation fails
(the weights are not there). This file is also that case (`python test_shard_unsloth.py`, HF_HOME set).

Two GPUs: Unsloth's Kaggle Llama-3.1 Alpaca notebook, converted as generated, run as `python train_ddp.py` in the
sharded mode (NBDDP_MODE=shard) and in DDP mode: the notebook trains, then generates greedily three times after training
(the fast decode) and saves its adapter. Checked: the sharded load ran; the per-step losses and everything the notebook
prints from its first generation on are the DDP run's.

The hub ids are served offline by bench/offline_hub.py's Llama-3.1 stand-in at 4 layers (full width, random weights).
Needs CUDA GPUs (1; 2), Unsloth and bitsandbytes (the GPU machines: .whl, ../shared/gpu/README.md), and the corpus for
the notebook; skipped elsewhere, saying why."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import need_corpus
from e2e import SCRIPT, assert_clean_exit, run_jobs

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = "Kaggle-Llama3.1_(8B)-Alpaca"
FIRST_GENERATION = "Below is an instruction"  # the notebook's Alpaca prompt: its first generation prints it


def _needs_gpus_and_unsloth(gpus):
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < gpus:
        pytest.skip(f"needs {gpus} CUDA GPU{'s' if gpus > 1 else ''} (Unsloth's 4-bit load and kernels need GPUs)")
    pytest.importorskip("bitsandbytes", reason="needs bitsandbytes (the GPU machines: .whl, ../shared/gpu/README.md)")
    pytest.importorskip("unsloth", reason="needs Unsloth (the GPU machines: .whl, ../shared/gpu/README.md)")


def _after_training(job):
    """What the notebook printed from its first generation on, without nbddp's own lines."""
    out = job.stdout
    assert FIRST_GENERATION in out, job.explain()
    return [line for line in out[out.index(FIRST_GENERATION):].splitlines() if not line.startswith("nbddp:")]


def _hub(home):
    """offline_hub's Llama-3.1 stand-in at 4 layers under every id Unsloth asks for, and the Alpaca rows."""
    sys.path.insert(0, str(ROOT / "bench"))
    import offline_hub
    assert offline_hub.main(["--home", str(home), "--models", "llama31", "--layers", "llama31=4",
                             "--datasets", "unsloth/alpaca-cleaned", "--max-rows", "400"]) == 0


def test_unsloths_fast_decode_gathers_each_sharded_layer_it_runs(tmp_path):
    _needs_gpus_and_unsloth(1)
    _hub(tmp_path / "hf")
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", CUDA_VISIBLE_DEVICES="0", PYTHONPATH=
               os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    got = json.loads(done.stdout.split("RESULT ", 1)[1].splitlines()[0])
    print(json.dumps(got))  # with -s: the figures
    assert got["new_tokens"] == 16 and got["sharded"] == got["whole"], got
    assert got["blocks"] == 4 and got["released"] and got["gathers"] >= 2 * 15, got  # 4 layers, 2 buffers
    assert got["without_the_attribute"] != "same", got


def _case():
    """One process: the whole model's greedy tokens, then the sharded model's, then without `_unsloth_block_swap`."""
    import torch.distributed as dist
    from unsloth import FastLanguageModel

    from nbddp.runtime.shard import nbddp_shard_model
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
    model, tokenizer = FastLanguageModel.from_pretrained("unsloth/Llama-3.1-8B", max_seq_length=256, load_in_4bit=True)
    model = FastLanguageModel.get_peft_model(model, r=8, lora_alpha=16, lora_dropout=0, bias="none", target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], random_state=3407)
    FastLanguageModel.for_inference(model)
    ids = tokenizer(["Below is an instruction that describes a task."], return_tensors="pt").to("cuda")

    def generate():
        out = model.generate(**ids, max_new_tokens=16, min_new_tokens=16, do_sample=False, use_cache=True)
        return out[0, ids["input_ids"].shape[1]:].tolist()

    whole = generate()
    shards = nbddp_shard_model(model, transport="host")
    released = all(p.numel() == 0 for b in shards.blocks for p in b.params if b.index not in shards.whole_blocks())
    shards.take_timing()
    sharded = generate()
    gathers = shards.take_timing()["gathers"]
    shards.free()
    layers = model.base_model.model.model.layers
    del layers._unsloth_block_swap
    try:
        without = "same" if generate() == whole else "other tokens"
    except Exception as exc:  # the layers' weights are empty: the fast decode's matmul fails
        without = type(exc).__name__
    print("RESULT " + json.dumps({"whole": whole, "sharded": sharded, "new_tokens": len(sharded), "gathers": gathers,
                                  "blocks": len(shards.blocks), "released": released,
                                  "without_the_attribute": without}), flush=True)
    dist.destroy_process_group()


def test_unsloth_generates_after_training_in_the_sharded_mode_as_in_ddp_mode(tmp_path):
    _needs_gpus_and_unsloth(2)
    from nbddp.pipeline import convert_notebook
    home = tmp_path / "hf"
    _hub(home)
    conversion = convert_notebook(str(need_corpus(NOTEBOOK)), script_name=SCRIPT)
    assert "shard_mode" in conversion.runtime.reasons
    runs = []
    for name, mode in (("sharded", {"NBDDP_MODE": "shard"}), ("ddp", {})):
        cwd = tmp_path / name
        cwd.mkdir()
        (cwd / SCRIPT).write_text(conversion.script, encoding="utf-8")  # one file, the runtime inlined
        runs.append(([sys.executable, SCRIPT], cwd, {
            **mode, "NBDDP_NPROC": "2", "HF_HOME": str(home), "CUDA_VISIBLE_DEVICES": "0,1",
            "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                          if p])}))
    sharded, ddp = run_jobs(runs, timeout=540)
    for job in (sharded, ddp):  # kept beside the run, to read after a failure
        (job.cwd / "output.txt").write_text(job.stdout + "\n--- stderr ---\n" + job.stderr, encoding="utf-8")
    assert_clean_exit(sharded)
    assert_clean_exit(ddp)
    assert sharded.count("loaded sharded over 2 processes, layer by layer") == 1, sharded.explain()
    assert "loaded sharded" not in ddp.stdout, ddp.explain()
    losses, reference = ([log["loss"] for log in job.trainer_logs() if "loss" in log] for job in (sharded, ddp))
    assert len(losses) == len(reference) == 60, (losses, reference)
    assert losses == pytest.approx(reference, rel=1e-3), (losses, reference)
    assert _after_training(sharded) == _after_training(ddp)


if __name__ == "__main__":
    _case()
