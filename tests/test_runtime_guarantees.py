"""What a script guarantees, under 2 real ranks (torchrun, gloo): waits that outlast rank-0 work, one writer, the
ranks' agreement said, input() that never hangs (tests/runtime_cases/guarantees_case.py).

The group's timeout is made 5 s (NBDDP_GROUP_TIMEOUT), standing in for NCCL's 10 minutes; rank 0's work lasts longer.
"""
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.ddp
CASES = os.path.join(os.path.dirname(__file__), "runtime_cases")
ENV = {"NBDDP_GROUP_TIMEOUT": "5", "NBDDP_WAIT_NOTICE": "2", "OMP_NUM_THREADS": "1"}
SLOW = 8  # seconds of rank-0 work in the ordinary job: 3 s past the group's timeout


def launch(mode, out, slow, stdin):
    env = {**os.environ, **ENV, "CASE_SLOW": str(slow)}
    read, write = os.pipe()  # an open pipe: its writing end stays open, unwritten, until the job ends
    try:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                               os.path.join(CASES, "guarantees_case.py"), mode, str(out)],
                              stdin=read if stdin == "open pipe" else stdin, capture_output=True, text=True,
                              timeout=240, env=env, cwd=CASES)
        ended = time.time()
    finally:
        os.close(read)
        os.close(write)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) if (out / f"rank{r}.json").exists() else None
             for r in range(2)]
    return done, done.stdout + done.stderr, ranks, ended


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both jobs at once, each in its own folder (most of either is rank 0's sleep, which leaves the cores to the
    other; each job's end is its own, taken as its subprocess returns): {mode: launch's result}."""
    cases = {"ok": (SLOW, "open pipe"),  # stdin: an open pipe that nobody writes (kept open until the job ends)
             "fail": (6, subprocess.DEVNULL)}  # stdin closed
    with ThreadPoolExecutor(len(cases)) as pool:
        started = {mode: pool.submit(launch, mode, tmp_path_factory.mktemp(f"guarantees-{mode}"), slow, stdin)
                   for mode, (slow, stdin) in cases.items()}
        return {mode: future.result() for mode, future in started.items()}


@pytest.fixture(scope="module")
def ordinary(runs):
    return runs["ok"]


def test_a_wait_for_rank_0_outlasts_the_groups_timeout(ordinary):
    done, output, ranks, _ = ordinary
    assert done.returncode == 0, output[-3000:]
    for seen in ranks:
        assert seen["group_timeout_s"] == 5.0  # the group would have timed out in a collective
        assert seen["barrier_s"] > SLOW - 1 > 5  # the ranks met after rank 0's work, past the group's timeout
    assert output.count("nbddp: rank 1 waiting for rank 0: save_pretrained\n") == 1


def test_every_save_is_written_once(ordinary):
    done, output, ranks, _ = ordinary
    first, second = ranks
    assert "guarded/config.json" in first["writes"] and "imported/config.json" in first["writes"]
    assert second["writes"] == ["rank1.json"]  # rank 1 opened nothing under the saved folders for writing
    assert second["imported_whole_after_call"]  # rank 1 went on only once rank 0 had saved (it came 2 s late)
    assert "nbddp: saved and written once (rank 1 skipped save_pretrained;" in output


def test_rank_0_says_whether_the_ranks_agree(ordinary):
    done, output, ranks, _ = ordinary
    assert len(re.findall(r"nbddp: ranks agree after train\(\): all 2 hold the same weights \(1,176 trained "
                          r"values in 12 tensors\)", output)) == 1
    # the case's own loop on each rank (no DDP, data that differs by rank) is found at the end of the script
    assert len(re.findall(r"nbddp: warning: after the script's own training steps, rank 1 holds other weights "
                          r"than rank 0 \(10 trained values in 2 tensors\): on rank 1: tensor 0 of shape \(\d+, \d+\) "
                          r"\(sum \S+ against \S+\)(, tensor 1 of shape \(\d+,\) \(sum \S+ against \S+\))? of 2 "
                          r"tensors(; the notebook's values that differ on rank 1: [\w, ]+)?\. Usual causes: training "
                          r"outside DDP",
                          output)) == 1


def test_input_with_an_open_pipe_nobody_writes(ordinary):
    done, output, ranks, _ = ordinary
    line = "input() in a 2-process job has no one to answer it (stdin is not a terminal and has nothing to read)"
    assert output.count(f"nbddp: {line}") == 1
    assert all(seen["input"].startswith(f"EOFError: nbddp: {line}") for seen in ranks)


def test_rank_0_failing_in_its_block_ends_the_job_with_its_error(runs):
    done, output, ranks, ended = runs["fail"]
    assert done.returncode != 0
    assert "RuntimeError: rank 0 failed during its save (test)" in output
    root = output[output.index("Root Cause (first observed failure)"):]
    assert re.search(r"rank\s*: 0 \(local_rank: 0\)", root), root
    raised = float(re.search(r"CASE rank 0 raises at ([0-9.]+)", output).group(1))
    assert ended - raised < 10  # seconds, not the group's timeout nor a hang
    assert output.count("nbddp: rank 1 waiting for rank 0: save_pretrained_gguf\n") == 1  # 6 s > the 5 s timeout
    line = "input() in a 2-process job has no one to answer it (stdin is closed)"
    assert output.count(f"nbddp: {line}") == 1
    assert all(seen["input"].startswith(f"EOFError: nbddp: {line}") for seen in ranks)
