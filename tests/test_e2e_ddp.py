"""End to end on CPU: the example notebook, converted by nbddp, trains as one 2-process DDP job under torchrun
(gloo) and also as one plain process. One job of each kind, shared by the tests below.

What the example notebook (notebooks/tiny_llama_sft.ipynb) prints and these tests count:
  "N seconds used for training on W process(es)."   trainer.args.world_size, printed by rank 0
  {'loss': ..., 'epoch': ...}                        the Trainer's log, one line per step on the main process
  "Generated: '...'"                                 the generation cell
  "Saved the LoRA adapters ..."                      the save cell
The notebook trains 6 steps of 2 examples per process on 16 rows: epoch 1.5 with 2 processes, 0.75 with one.
"""
from __future__ import annotations

import ast
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tinymodels import EXAMPLE_NOTEBOOK, save_tiny_llama

pytestmark = pytest.mark.ddp

MAX_STEPS, ROWS, PER_DEVICE = 6, 16, 2
SCRIPT = "train_ddp.py"
DISTRIBUTED_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                   "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


@dataclass
class Job:
    argv: list
    cwd: Path
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def explain(self) -> str:
        return (f"{' '.join(self.argv)} in {self.cwd}: exit {self.returncode} after {self.seconds:.1f} s\n"
                f"--- stdout (end) ---\n{self.stdout[-3000:]}\n--- stderr (end) ---\n{self.stderr[-6000:]}")

    def count(self, text: str) -> int:
        return sum(text in line for line in self.stdout.splitlines())

    def trainer_logs(self) -> list[dict]:
        """The Trainer's per-step log dicts (values may be printed as strings)."""
        logs = []
        for line in self.stdout.replace("\r", "\n").splitlines():
            line = line.strip()
            if line.startswith("{'loss'"):
                logs.append({k: float(v) for k, v in ast.literal_eval(line).items()})
        return logs


def child_env(home: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in DISTRIBUTED_ENV and not k.startswith(("ACCELERATE_", "NBDDP_"))}
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
               HF_HOME=str(home / "hf"), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               CUDA_VISIBLE_DEVICES="")
    return env


def run_job(argv, cwd: Path, timeout: int = 300) -> Job:
    start = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, env=child_env(cwd), capture_output=True, text=True, timeout=timeout)
    return Job(argv, cwd, done.returncode, done.stdout, done.stderr, time.monotonic() - start)


@pytest.fixture(scope="module")
def script() -> str:
    import nbddp

    return nbddp.convert(str(EXAMPLE_NOTEBOOK))


def _job(tmp_path_factory, script, name, argv) -> Job:
    cwd = tmp_path_factory.mktemp(name)
    (cwd / SCRIPT).write_text(script, encoding="utf-8")
    return run_job(argv, cwd)


@pytest.fixture(scope="module")
def ddp_job(tmp_path_factory, script) -> Job:
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", SCRIPT]
    return _job(tmp_path_factory, script, "ddp", argv)


@pytest.fixture(scope="module")
def plain_job(tmp_path_factory, script) -> Job:
    return _job(tmp_path_factory, script, "plain", [sys.executable, SCRIPT])


def assert_clean_exit(job: Job):
    assert job.returncode == 0, job.explain()
    assert "Traceback" not in job.stderr, job.explain()
    assert "destroy_process_group() was not called" not in job.stderr, job.explain()


def assert_adapter_saved_once(job: Job):
    saved = job.cwd / "lora_model"
    assert (saved / "adapter_config.json").is_file(), job.explain()
    assert (saved / "adapter_model.safetensors").is_file(), job.explain()
    assert job.count("Saved the LoRA adapters") == 1, job.explain()
    assert job.count("Generated:") == 1, job.explain()


def assert_trained(job: Job, world_size: int):
    logs = job.trainer_logs()
    assert len(logs) == MAX_STEPS, f"expected {MAX_STEPS} loss lines, one per step, once per job\n" + job.explain()
    assert all(math.isfinite(log["loss"]) for log in logs), logs
    assert logs[-1]["epoch"] == pytest.approx(MAX_STEPS * PER_DEVICE * world_size / ROWS), logs
    assert job.count(f"seconds used for training on {world_size} process(es).") == 1, job.explain()


def test_readme_command_writes_the_script_under_test(tmp_path, script):
    """`nbddp convert notebooks/tiny_llama_sft.ipynb` writes train_ddp.py in the cwd: the script run below."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / EXAMPLE_NOTEBOOK.name).write_bytes(EXAMPLE_NOTEBOOK.read_bytes())
    done = subprocess.run([sys.executable, "-m", "nbddp", "convert", f"notebooks/{EXAMPLE_NOTEBOOK.name}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / SCRIPT).read_text(encoding="utf-8") == script
    assert "torchrun --standalone --nproc_per_node=2 train_ddp.py" in done.stdout


def test_torchrun_two_processes_exit_cleanly(ddp_job):
    assert_clean_exit(ddp_job)
    assert ddp_job.count("nbddp: 2 processes") == 1, ddp_job.explain()


def test_torchrun_two_processes_train_as_one_ddp_job(ddp_job):
    # Two ranks that each trained alone would log every step twice and reach only epoch 0.75.
    assert "parallel_mode != ParallelMode.DISTRIBUTED" not in ddp_job.stderr, ddp_job.explain()
    assert_trained(ddp_job, world_size=2)


def test_torchrun_saves_and_generates_on_rank_0_only(ddp_job):
    assert_adapter_saved_once(ddp_job)
    assert (ddp_job.cwd / "tiny-llama" / "model.safetensors").is_file()


def test_plain_python_runs_the_same_script(plain_job):
    assert_clean_exit(plain_job)
    assert plain_job.count("nbddp: ") == 0, plain_job.explain()  # no banner, no DDP strategy line
    assert_trained(plain_job, world_size=1)
    assert_adapter_saved_once(plain_job)


def test_tiny_llama_is_the_same_for_the_same_seed(tmp_path):
    a = save_tiny_llama(tmp_path / "a")
    b = save_tiny_llama(tmp_path / "b")
    c = save_tiny_llama(tmp_path / "c", seed=1)
    for name in ("model.safetensors", "tokenizer.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
