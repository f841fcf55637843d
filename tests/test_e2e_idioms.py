"""End to end on CPU: a notebook of idioms the converter follows through the notebook's own code (issue 28),
converted and run as one 2-process torchrun job (gloo), every rank's output shown (--tee).

What it checks, from files the job's own modules write (nothing of nbddp's logic):
  one writer per saved folder: a notebook function that trains and saves, and a loop that trains and saves each
      epoch (probe.py, imported by the notebook, logs each save_pretrained call with its rank);
  one tracker run: wandb.init/log/finish from rank 0 only (a fake `wandb` module beside the script logs each call),
      also a run opened as a context around training, which trains on both ranks;
  one print of evaluate's result, while evaluate itself runs on both ranks (it is a collective);
  one writer of a file the notebook opens for writing, read back on every rank after it.
"""
from __future__ import annotations

import pytest

from e2e import assert_clean_exit, run_notebook
from tinymodels import save_tiny_llama

pytestmark = pytest.mark.ddp

PROBE = '''import os
import transformers

_save = transformers.PreTrainedModel.save_pretrained


def save_pretrained(self, folder, *args, **kwargs):
    with open("writers.log", "a") as fh:
        fh.write(f"{os.environ.get('RANK', '0')} {folder}\\n")
    return _save(self, folder, *args, **kwargs)


transformers.PreTrainedModel.save_pretrained = save_pretrained
'''

FAKE_WANDB = '''import os


def _log(what):
    with open("tracker.log", "a") as fh:
        fh.write(f"{os.environ.get('RANK', '0')} {what}\\n")


class Run:
    def log(self, data):
        _log(f"run.log {sorted(data)}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        _log("exit")


def init(**kwargs):
    _log("init")
    return Run()


def log(data):
    _log(f"log {sorted(data)}")


def finish():
    _log("finish")
'''

CELLS = [
    "import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\nimport probe\nimport wandb\n"
    "from datasets import Dataset\n"
    "from transformers import AutoModelForCausalLM as Loader, AutoTokenizer, Trainer, TrainingArguments\n"
    "from transformers import DataCollatorForLanguageModeling\n",
    "model = Loader.from_pretrained('tiny-llama')\ntokenizer = AutoTokenizer.from_pretrained('tiny-llama')\n"
    "rows = [f'sample {i} says hello to the world' for i in range(16)]\nlongest = max(map(len, rows))\n"
    "ds = Dataset.from_dict({'text': rows}).map(lambda b: tokenizer(b['text']), batched = True,\n"
    "                                           remove_columns = ['text'])\n",
    "run = wandb.init(project = 'idioms')\n"
    "args = TrainingArguments(output_dir = 'out', per_device_train_batch_size = 2, max_steps = 2, logging_steps = 1,\n"
    "                         save_strategy = 'no', report_to = 'none', use_cpu = True)\n"
    "trainer = Trainer(model = model, args = args, train_dataset = ds, eval_dataset = ds,\n"
    "                  data_collator = DataCollatorForLanguageModeling(tokenizer, mlm = False))\n",
    "def train_and_save(folder):\n    trainer.train()\n    model.save_pretrained(folder)\n"
    "    run.log({'saved': folder})\n",
    "train_and_save('model_a')\n",
    "for epoch in range(2):\n    trainer.train()\n    model.save_pretrained(f'epoch_{epoch}')\n"
    "    wandb.log({'epoch': epoch})\n",
    "print(f\"EVAL {trainer.evaluate()['eval_loss']:.4f}\")\nwandb.finish()\n",
    "with wandb.init(project = 'ctx') as ctx_run:\n    trainer.train()\n    ctx_run.log({'inside': 1})\n",
    "with open('notes.txt', 'a') as notes:\n    notes.write(os.environ.get('RANK', '0') + '\\n')\n",
    "ranks_read = open('notes.txt').read().split()\nassert ranks_read == ['0'], ranks_read\n",
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("idioms")
    save_tiny_llama(cwd / "tiny-llama")
    (cwd / "probe.py").write_text(PROBE, encoding="utf-8")
    (cwd / "wandb.py").write_text(FAKE_WANDB, encoding="utf-8")
    done, conversion = run_notebook(CELLS, cwd)
    return done, conversion.script


def test_the_job_exits_cleanly(job):
    done, script = job
    assert_clean_exit(done)
    assert "CUDA_VISIBLE_DEVICES'] = '0'" not in script


def test_one_writer_per_saved_folder(job):
    done, _ = job
    lines = (done.cwd / "writers.log").read_text().split("\n")
    assert sorted(filter(None, lines)) == ["0 epoch_0", "0 epoch_1", "0 model_a"], done.explain()
    for folder in ("model_a", "epoch_0", "epoch_1"):
        assert (done.cwd / folder / "model.safetensors").is_file(), folder


def test_one_tracker_run_from_rank_0(job):
    done, _ = job
    lines = [line for line in (done.cwd / "tracker.log").read_text().split("\n") if line]
    assert lines == ["0 init", "0 run.log ['saved']", "0 log ['epoch']", "0 log ['epoch']", "0 finish",
                     "0 init", "0 run.log ['inside']", "0 exit"], lines  # a run as a context around training


def test_a_file_opened_for_writing_is_written_once_and_read_by_every_rank(job):
    done, _ = job
    assert (done.cwd / "notes.txt").read_text() == "0\n", done.explain()


def test_evaluate_runs_everywhere_and_prints_once(job):
    done, _ = job
    assert done.count("EVAL ") == 1, done.explain()
