"""The frozen base sharded over 2 gloo ranks, the adapters data-parallel (nbddp/runtime/shard.py, docs/sharded.md):
trainable weights and the mean loss equal one process's on the whole batch, with the blocks checkpointed or not,
with the next block gathered ahead (an asynchronous all-gather) or not, with the model made on the meta device
block by block, and with the gathers copying the other rank's slices from shared host memory (no files left);
no rank holds more than two blocks' frozen weights at a time, and each block runs whole; 3 steps of 4 blocks make
14 gathers. After training, rank 0 alone runs the blocks' parts without calling the blocks, as Unsloth's fast decode
does, through the layer list's `_unsloth_block_swap` (enter/leave): the outputs of the model trained on one process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from e2e import torchrun_launch

pytestmark = pytest.mark.ddp
CASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime_cases", "shard_case.py")


@pytest.mark.parametrize("checkpointed,variant", [("0", "prefetch"), ("1", "prefetch"), ("1", "sync"), ("1", "meta"),
                                                        ("1", "host")])
def test_sharded_frozen_blocks_train_as_one_process(checkpointed, variant):
    argv, env = torchrun_launch(CASE, 2, dict(os.environ), script_args=[checkpointed, variant])
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if "RESULT " in line).split("RESULT ", 1)[1])
    assert result["max_weight_diff"] < 1e-5 and result["mean_loss_diff"] < 1e-5, result
    assert result["frozen_sharded"] == 16  # 4 blocks x (base weight and bias, norm weight and bias)
    assert result["frozen_elements_kept_between_blocks"] == 50 * 16 + 16 * 50 + 50, result  # embedding and head
    assert result["running_block_whole"] and result["most_blocks_whole"] <= 2, result
    # 3 steps of 4 blocks in two buffers: 4 + 2 gathers in the first step (the last two blocks of the forward pass
    # are the first two of the backward pass), 2 + 2 in each step after (the first two blocks of the backward pass
    # are the first two of the next forward pass)
    assert result["gathers"] == 14, result
    assert result["files_left"] == 0, result
    if variant == "host":  # rank 0 alone runs each block's parts, not the block, between enter(i) and leave(i)
        assert result["by_parts_diff"] < 1e-5, result


@pytest.mark.bench
def test_the_training_bench_compares_split_and_sharded_on_cpu(tmp_path):
    """bench/shard_train.py's CPU path (gloo, a tiny Llama): split mode and the sharded mode, equal losses and
    adapters; the GPU runs (bench/results/shard-*) use the same code with --device cuda."""
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "shard_train.py")
    out = tmp_path / "cpu.json"
    done = subprocess.run([sys.executable, bench, "run", "--out", str(out), "--work", str(tmp_path / "work"),
                           "--device", "cpu", "--shape", "tiny", "--dtype", "float32", "--sms", "0", "--cores", "",
                           "--modes", "split,shard", "--steps", "2", "--warmup", "1", "--batch", "2", "--seq", "16"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row = json.loads(out.read_text())["comparison"]["shard_vs_split"]
    assert row["max_rel_loss_diff"] < 1e-5 and row["adapters"]["max_abs_diff"] < 1e-5, row
