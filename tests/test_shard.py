"""The frozen base sharded over 2 gloo ranks, the adapters data-parallel (nbddp/runtime/shard.py, docs/sharded.md):
trainable weights and the mean loss equal one process's on the whole batch, with the blocks checkpointed or not, and
between blocks no rank holds any block's frozen weights."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from e2e import torchrun_launch

pytestmark = pytest.mark.ddp
CASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime_cases", "shard_case.py")


@pytest.mark.parametrize("checkpointed", ["0", "1"])
def test_sharded_frozen_blocks_train_as_one_process(checkpointed):
    argv, env = torchrun_launch(CASE, 2, dict(os.environ), script_args=[checkpointed])
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if "RESULT " in line).split("RESULT ", 1)[1])
    assert result["max_weight_diff"] < 1e-5 and result["mean_loss_diff"] < 1e-5, result
    assert result["frozen_sharded"] == 16  # 4 blocks x (base weight and bias, norm weight and bias)
    assert result["frozen_elements_kept_between_blocks"] == 50 * 16 + 16 * 50 + 50, result  # embedding and head
