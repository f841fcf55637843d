"""End to end on CPU: the example notebook, converted by nbddp, trains as one 2-process DDP job under torchrun
(gloo) and also as one plain process. One job of each kind, shared by the tests below (what they count: e2e.py).
"""
from __future__ import annotations

import subprocess
import sys

import pytest

import nbddp
from e2e import (MAX_STEPS, SCRIPT, Job, assert_adapter_saved_once, assert_clean_exit, assert_trained, run_job,
                 start_jobs)
from tinymodels import EXAMPLE_NOTEBOOK, save_tiny_llama

pytestmark = pytest.mark.ddp


@pytest.fixture(scope="session")  # for plain_started
def script():
    """The example's conversion as `nbddp convert` writes it: the script and its runtime file beside it."""
    from nbddp.pipeline import convert_notebook

    return convert_notebook(str(EXAMPLE_NOTEBOOK), single_file=False)


@pytest.fixture(scope="session")  # the scope of example_ddp_job, which pytest would set up first otherwise
def plain_started(tmp_path_factory, script):
    """The plain job, started in the background before the torchrun job, so that the two run at once (neither reads
    time; e2e.start_jobs)."""
    cwd = tmp_path_factory.mktemp("plain")
    (cwd / SCRIPT).write_text(script.script, encoding="utf-8")
    (cwd / script.runtime_file).write_text(script.runtime_text, encoding="utf-8")
    started = start_jobs([([sys.executable, SCRIPT], cwd, None)])
    yield started
    started.close()


@pytest.fixture(scope="module")
def ddp_job(plain_started, example_ddp_job) -> Job:
    return example_ddp_job  # conftest.py: one run shared with test_session.py


@pytest.fixture(scope="module")
def plain_job(plain_started) -> Job:
    return plain_started.jobs()[0]


def test_readme_command_writes_the_script_under_test(tmp_path, script):
    """`nbddp convert notebooks/tiny_llama_sft.ipynb` writes train_ddp.py in the cwd: the script run below."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / EXAMPLE_NOTEBOOK.name).write_bytes(EXAMPLE_NOTEBOOK.read_bytes())
    done = subprocess.run([sys.executable, "-m", "nbddp", "convert", f"notebooks/{EXAMPLE_NOTEBOOK.name}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / SCRIPT).read_text(encoding="utf-8") == script.script
    assert (tmp_path / script.runtime_file).read_text(encoding="utf-8") == script.runtime_text
    assert "torchrun --standalone --nproc_per_node=2 train_ddp.py" in done.stdout


def test_torchrun_two_processes_exit_cleanly(ddp_job):
    assert_clean_exit(ddp_job)
    assert ddp_job.count("nbddp: 2 processes, this one is rank 0") == 1, ddp_job.explain()


def test_an_accumulation_of_1_keeps_the_batch_by_splitting_it(ddp_job):
    assert ddp_job.count("nbddp: 2 processes keep the notebook's batch of 2: per_device_train_batch_size 2 -> 1 per "
                         "rank (gradient_accumulation_steps 1 does not divide by 2)") == 1, ddp_job.explain()


def test_torchrun_two_processes_train_as_one_ddp_job(ddp_job):
    # Two ranks that each trained alone would log every step twice; each takes 1 of the notebook's 2 samples a step.
    assert "parallel_mode != ParallelMode.DISTRIBUTED" not in ddp_job.stderr, ddp_job.explain()
    assert_trained(ddp_job, world_size=2, per_device=1)


def test_two_ranks_train_with_one_process_losses_step_by_step(ddp_job, plain_job):
    """The example as the README converts it (accumulation 1): the notebook's batch of 2 split over 2 ranks."""
    ones, twos = plain_job.trainer_logs(), ddp_job.trainer_logs()
    assert len(ones) == len(twos) == MAX_STEPS, ddp_job.explain()
    for a, b in zip(ones, twos):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-3), (ones, twos)


def test_torchrun_saves_and_generates_on_rank_0_only(ddp_job):
    assert_adapter_saved_once(ddp_job)
    assert (ddp_job.cwd / "tiny-llama" / "model.safetensors").is_file()
    end = [line for line in ddp_job.stdout.splitlines() if line.startswith("nbddp: done (status 0) in ")]
    assert len(end) == 1 and "saved by rank 0, once: ./tiny-llama (save_pretrained), lora_model (save_pretrained); " \
        "the other ranks' warnings and errors: on this console" in end[0], ddp_job.explain()  # the job's last line


def test_plain_python_runs_the_same_script(plain_job):
    assert_clean_exit(plain_job)
    assert plain_job.count("nbddp: ") == 1, plain_job.explain()  # no banner, no DDP strategy line; what runs:
    assert plain_job.count("nbddp: no GPU visible: one process on the CPU (NBDDP_NPROC=2 runs 2 processes") == 1
    assert_trained(plain_job, world_size=1)
    assert_adapter_saved_once(plain_job)


def test_tiny_llama_is_the_same_for_the_same_seed(tmp_path):
    a = save_tiny_llama(tmp_path / "a")
    b = save_tiny_llama(tmp_path / "b")
    c = save_tiny_llama(tmp_path / "c", seed=1)
    for name in ("model.safetensors", "tokenizer.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()


STREAMED = [
    "from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer\n"
    "from threading import Thread\n"
    "model = AutoModelForCausalLM.from_pretrained('tiny-llama')\n"
    "tokenizer = AutoTokenizer.from_pretrained('tiny-llama')\n",
    "inputs = tokenizer(['Name a primary color.'], return_tensors = 'pt')\n"
    "streamer = TextIteratorStreamer(tokenizer, skip_prompt = True)\n"
    "thread = Thread(target = model.generate, kwargs = dict(**inputs, streamer = streamer, max_new_tokens = 8,\n"
    "                                                      do_sample = False))\n"
    "thread.start()\n"
    "for new_text in streamer:\n"
    "    pass\n"
    "print('STORY-END')\n",
]


def test_streamed_generation_runs_once_under_torchrun(tmp_path):
    """Generation handed to a thread (TextIteratorStreamer + Thread(target=model.generate)) and the loop that reads
    it run on rank 0 only: the story is printed once, and rank 1 starts no generation thread."""
    import nbformat

    from conftest import make_notebook

    save_tiny_llama(tmp_path / "tiny-llama")
    script = nbddp.convert(nbformat.writes(make_notebook(*STREAMED)))
    (tmp_path / SCRIPT).write_text(script, encoding="utf-8")
    # --tee: every rank's output reaches stdout, so a print on rank 1 would be counted too
    job = run_job([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--tee=3",
                   SCRIPT], tmp_path)
    assert_clean_exit(job)
    assert job.count("STORY-END") == 1, job.explain()
    assert script.index("nbddp_rest_on_rank0()") < script.index("streamer = TextIteratorStreamer")  # rank 0 alone
