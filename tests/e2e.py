"""Running a converted script as a user would, on CPU: the job's output and what it left, and the checks on them.
Shared by the tests that run the example notebook (test_e2e_ddp.py, test_runtime_launch.py, test_multinode.py), and
by the tests that start torchrun (launches built by nbddp's recipe) or check that a dry run said what then ran.

What the example notebook (notebooks/tiny_llama_sft.ipynb) prints and these checks count:
  "N seconds used for training on W process(es)."   trainer.args.world_size, printed by rank 0
  {'loss': ..., 'epoch': ...}                        the Trainer's log, one line per step on the main process
  "Generated: '...'"                                 the generation cell
  "Saved the LoRA adapters ..."                      the save cell
The notebook trains 6 steps of 2 examples on 16 rows: epoch 0.75, its batch kept on 2 processes (1 example each);
4 processes, which divide neither its batch nor its accumulation, train 2 examples each: epoch 3.
"""
from __future__ import annotations

import ast
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from nbddp import launch

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


def torchrun_launch(script, nproc: int, env: dict, **how):
    """(argv, environment) of `script` under torchrun as nbddp's recipe builds them, with this interpreter; every
    rank's output on the console (the tests read all of it). `how`: the recipe's flags, script_args, ..."""
    job = launch.build(script, nproc, python=sys.executable, cpus=launch.cpu_count(), env=env, routed=False, **how)
    return job.argv, {**env, **job.env}


def run_job(argv, cwd: Path, timeout: int = 300, env=None) -> Job:
    start = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, env={**child_env(cwd), **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)
    return Job(argv, cwd, done.returncode, done.stdout, done.stderr, time.monotonic() - start)


class AtOnce:
    """Independent processes, (argv, cwd, environment) each, all started at once; done() waits for them and gives
    each one's CompletedProcess (text output), in that order; close() kills any left. Only for jobs that share
    nothing (each its own folder and output; --standalone picks its own port) and whose checks read no time but a
    bound against a hang: a job spends seconds importing, starting its launcher and waiting for its ranks, which
    leaves a core idle that another job's process uses. Output goes to files: no job waits on a full pipe.
    `stdins`: each one's stdin (default: this process's)."""

    def __init__(self, runs, timeout: int = 300, stdins=None):
        self.runs, self.procs, self.files, self.results = list(runs), [], [], None
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        try:
            for (argv, cwd, env), stdin in zip(self.runs, stdins or [None] * len(self.runs)):
                self.files.append((tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")))
                self.procs.append(subprocess.Popen(argv, cwd=cwd, env=env, stdin=stdin, stdout=self.files[-1][0],
                                                   stderr=self.files[-1][1], text=True))
        except BaseException:
            self.close()
            raise

    def done(self) -> list[subprocess.CompletedProcess]:
        if self.results is None:
            try:
                self.ended = [None] * len(self.procs)  # each one's own end (polled: seconds to 0.05 s)
                while None in self.ended:
                    if time.monotonic() > self.deadline:
                        raise subprocess.TimeoutExpired([p.args for p in self.procs], self.deadline - self.started)
                    for i, proc in enumerate(self.procs):
                        if self.ended[i] is None and proc.poll() is not None:
                            self.ended[i] = time.monotonic()
                    time.sleep(0.05)
                results = []
                for proc, (out, err) in zip(self.procs, self.files):
                    out.seek(0)
                    err.seek(0)
                    results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read()))
                self.results = results
            finally:
                self.close()
        return self.results

    def jobs(self) -> list[Job]:
        """done() as run_job's Jobs; seconds: each one's, from the start to its end."""
        done = self.done()
        return [Job(argv, cwd, ran.returncode, ran.stdout, ran.stderr, ended - self.started)
                for (argv, cwd, _), ran, ended in zip(self.runs, done, self.ended)]

    def close(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for out, err in self.files:
            out.close()
            err.close()


def run_at_once(runs, timeout: int = 300) -> list[subprocess.CompletedProcess]:
    return AtOnce(runs, timeout).done()


def start_jobs(runs, timeout: int = 300, stdins=None) -> AtOnce:
    """run_job for each of `runs`, (argv, cwd, env) each, started at once (AtOnce); .jobs() waits for them."""
    return AtOnce([(argv, cwd, {**child_env(cwd), **(env or {})}) for argv, cwd, env in runs], timeout, stdins)


def run_jobs(runs, timeout: int = 300, stdins=None) -> list[Job]:
    return start_jobs(runs, timeout, stdins).jobs()


def notebook_job(cells, cwd: Path, *, options=None, env=None):
    """A notebook of these code cells converted by nbddp into cwd/train_ddp.py, to run as one 2-process torchrun job,
    every rank's output on the console (--tee=3): ((argv, cwd, env) as run_jobs takes them, the conversion)."""
    import nbformat

    from conftest import make_notebook
    from nbddp.pipeline import convert_notebook

    conversion = convert_notebook(nbformat.writes(make_notebook(*cells)), options=options)
    (cwd / SCRIPT).write_text(conversion.script, encoding="utf-8")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--tee=3", SCRIPT]
    return (argv, cwd, env), conversion


def run_notebook(cells, cwd: Path, *, options=None, timeout: int = 300, env=None):
    """notebook_job, run: (the job, the conversion)."""
    (argv, cwd, env), conversion = notebook_job(cells, cwd, options=options, env=env)
    return run_job(argv, cwd, timeout=timeout, env=env), conversion


def rank_records(cwd: Path, ranks: int = 2) -> list:
    """What each rank of a test's notebook recorded in rank<R>.json (None where it wrote nothing)."""
    return [json.loads((cwd / f"rank{r}.json").read_text()) if (cwd / f"rank{r}.json").exists() else None
            for r in range(ranks)]


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


def assert_trained(job: Job, world_size: int, per_device: int = PER_DEVICE):
    logs = job.trainer_logs()
    assert len(logs) == MAX_STEPS, f"expected {MAX_STEPS} loss lines, one per step, once per job\n" + job.explain()
    assert all(math.isfinite(log["loss"]) for log in logs), logs
    assert logs[-1]["epoch"] == pytest.approx(MAX_STEPS * per_device * world_size / ROWS), logs
    assert job.count(f"seconds used for training on {world_size} process(es).") == 1, job.explain()


# A rank's lines that record how its launcher (torchrun, the rank's parent) was started (argv and environment), its
# process id, and the rank's own environment.
LAUNCHER_PROBE = (
    "import json as _json, os as _os, psutil as _psutil\n"
    "if _os.environ.get('RANK') == '0':\n"
    "    _launcher = _psutil.Process(_os.getppid())\n"
    "    with open('launcher.json', 'w') as _fh:\n"
    "        _json.dump({'argv': _launcher.cmdline(), 'env': _launcher.environ(), 'pid': _launcher.pid,\n"
    "                    'rank_env': dict(_os.environ)}, _fh)\n")


def launcher_seen(folder: Path) -> dict:
    return json.loads((folder / "launcher.json").read_text())


def dry_run_command(line: str):
    """(environment it sets, argv) of a dry run's command line: `K=V ... python -m torch.distributed.run ...`."""
    tokens = shlex.split(line)
    count = next(i for i, tok in enumerate(tokens) if "=" not in tok or not tok.split("=")[0].isidentifier())
    return dict(tok.split("=", 1) for tok in tokens[:count]), tokens[count:]


def assert_ran_as_dry_run_said(line: str, folder: Path, base_env: dict):
    """The launcher that ran had the argv the dry run printed, and exactly `base_env` plus what it printed, plus the
    process id of what started it (NBDDP_OWNER: the ranks watch it; not part of a command to copy)."""
    env, argv = dry_run_command(line)
    seen = launcher_seen(folder)
    assert seen["argv"] == argv, (seen["argv"], argv)
    assert seen["env"].pop("NBDDP_OWNER", None) == str(os.getpid()), "the ranks cannot tell who started them"
    assert env and seen["env"] == {**base_env, **env}, set(seen["env"].items()) ^ set({**base_env, **env}.items())
