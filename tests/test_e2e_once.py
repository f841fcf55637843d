"""End to end on CPU: what a notebook does outside training happens once, whatever it calls (issue 37), in a
2-process torchrun job (gloo), every rank's output shown.

The notebook is one of ours, split over cells. Outside training it calls `sidefx`, a module beside the script that
nbddp has never heard of (it logs each call with the calling rank to effects.log, below Python's open, as a web call
would act: no file net of the runtime's hides a second rank's call), and the standard library: a folder made without
exist_ok, a file it writes and runs (`%run`) that only announces, one beside it that sets the step count and exits, a CSV appended to at a path computed from the notebook's own variables and read back for training, a text
file written by the notebook's own function, prints in a loop and an `if`, an upload, an archive, a server started
after training, a submission built from a list filled after training, a print inside the notebook's function after
training, a sqlite database the training function writes, a logging handler that sends records as datagrams; a print
and a `tqdm.notebook` bar inside the training function every rank runs. Training itself (a Trainer on a tiny Llama)
runs on both ranks and records what data each rank trained on (rank<R>.json). A log file the notebook configures gets
each line once, and a callback the notebook gives the Trainer writes its file once.
"""
from __future__ import annotations

import contextlib
import json
import pickle
import socket
import sqlite3

import pytest

from e2e import assert_clean_exit, rank_records, run_notebook
from tinymodels import save_tiny_llama

pytestmark = pytest.mark.ddp

SIDEFX = '''import os


def _log(what):  # below Python's open (a web call would be too): no file net of nbddp's sees it
    fd = os.open("effects.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{os.environ.get('RANK', '0')} {what}\\n".encode())
    os.close(fd)


def publish(path):
    _log(f"publish {path}")


def pack(folder, out):
    import shutil
    _log(f"pack {out}")
    return shutil.make_archive(out, "zip", folder)


def announce(text):
    _log(f"announce {text}")


def serve(model):
    _log("serve")


class Pager:  # a client: its methods send
    def send(self, text):
        _log(f"page {text}")
'''

CELLS = [
    "import os, csv, json, random, logging, pathlib\nimport sidefx\nfrom datasets import Dataset\n"
    "from tqdm.notebook import tqdm\nfrom sqlite3 import connect as open_db\n"
    "from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments, TrainerCallback\n"
    "from transformers import DataCollatorForLanguageModeling\n"
    "logging.basicConfig(filename = 'run.log', level = logging.INFO, format = '%(message)s', force = True)\n"
    "log = logging.getLogger('notebook')\n",
    "%%writefile seeding.py\nimport os\nimport random\nimport torch\ndef seed_all(seed):\n    random.seed(seed)\n"
    "    torch.manual_seed(seed)\n    fd = os.open('seeded.log', os.O_WRONLY | os.O_APPEND | os.O_CREAT)\n"
    "    os.write(fd, os.environ.get('RANK', '0').encode() + b'\\n')\n    os.close(fd)\n",
    "import seeding\nseeding.seed_all(5)\n",
    "work = pathlib.Path('work') / 'run1'\nos.makedirs(work)\n",
    "%%writefile notify.py\nimport sidefx\nsidefx.announce('notify')\nNOTIFIED = True\n",
    "%run notify.py\n",
    "%run -e limits\n",
    "rows = [f'sample {i} says hello to the world' for i in range(24)]\nrandom.shuffle(rows)\n"
    "for r in rows[:2]:\n    print('ROW', r)\nif len(rows) > 3:\n    print('MANY ROWS')\n",
    "with open(work / 'train.csv', 'a', newline = '') as fh:\n    writer = csv.writer(fh)\n"
    "    for r in rows:\n        writer.writerow([r])\n",
    "def export(lines, name):\n    target = work / name\n    with open(target, 'a') as out:\n"
    "        out.write('\\n'.join(lines) + '\\n')\n    sidefx.publish(str(target))\n    return target\n",
    "preview = export(rows[:4], 'preview.txt')\nfor i in range(3):\n    sidefx.announce(f'step {i}')\n",
    "texts = [r[0] for r in csv.reader(open(work / 'train.csv'))]\nlog.info('read %d rows', len(texts))\n",
    "class Notes(TrainerCallback):\n    def __init__(self):\n        self.pager = sidefx.Pager()\n"
    "    def on_log(self, args, state, control, logs = None, **kwargs):\n"
    "        with open('callback.log', 'a') as fh:\n            fh.write(f\"{os.environ['RANK']} step {state.global_step}\\n\")\n"
    "        self.pager.send(f'step {state.global_step}')\n",
    "pager = sidefx.Pager()\nmodel = AutoModelForCausalLM.from_pretrained('tiny-llama')\n"
    "tokenizer = AutoTokenizer.from_pretrained('tiny-llama')\n"
    "ds = Dataset.from_dict({'text': texts}).map(lambda b: tokenizer(b['text']), batched = True,\n"
    "                                            remove_columns = ['text'])\n"
    "args = TrainingArguments(output_dir = 'out', per_device_train_batch_size = 2, max_steps = STEPS, logging_steps = 1,\n"
    "                         save_strategy = 'no', report_to = 'none', use_cpu = True)\n"
    "trainer = Trainer(model = model, args = args, train_dataset = ds, callbacks = [Notes()],\n"
    "                  data_collator = DataCollatorForLanguageModeling(tokenizer, mlm = False))\n",
    "def fit():\n    with open(f\"rank{os.environ['RANK']}.json\", 'w') as fh:\n"
    "        json.dump({'texts': texts}, fh)\n    log.info('fitting')\n    log.warning('fit warning')\n"
    "    print('FITTING', flush = True)\n    sidefx.announce('fit')\n    pager.send('fit')\n"
    "    with open(work / 'head.json', 'w') as fh:\n        json.dump(texts[:2], fh)\n"
    "    with open(work / 'head.json') as fh:\n        assert json.load(fh) == texts[:2]\n"
    "    db = open_db(work / 'metrics.db')\n    db.execute('CREATE TABLE IF NOT EXISTS m (step INT)')\n"
    "    for i in range(3):\n        db.execute('INSERT INTO m VALUES (?)', (i,))\n    db.commit()\n"
    "    assert db.execute('SELECT COUNT(*) FROM m').fetchone()[0] >= 3\n    db.close()\n"
    "    for _ in tqdm(range(3), desc = 'warm-up'):\n        pass\n    return trainer.train()\n",
    "stats = fit()\n",
    "answers = []\nfor i in range(3):\n    answers.append(f'{i},{stats.training_loss > 0}')\n",
    "with open('submission.csv', 'a') as fh:\n    fh.write('\\n'.join(answers) + '\\n')\n"
    "def report():\n    print('REPORT', len(answers))\nreport()\n",
    "sidefx.pack(str(work), 'bundle')\nsidefx.serve(model)\nlog.info('done')\n",
]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The job, with a logger whose handler sends each record as a datagram to a socket of this test's."""
    cwd = tmp_path_factory.mktemp("once")
    save_tiny_llama(cwd / "tiny-llama")
    (cwd / "sidefx.py").write_text(SIDEFX, encoding="utf-8")
    (cwd / "limits.py").write_text("import sys\nSTEPS = 2\nsys.exit(0)\n", encoding="utf-8")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as inbox:
        inbox.bind(("127.0.0.1", 0))
        port = inbox.getsockname()[1]
        sender = ("from logging.handlers import DatagramHandler\nimport socket as so\nudp = logging.getLogger('udp')\n"
                  f"udp.addHandler(DatagramHandler('127.0.0.1', {port}))\nudp.propagate = False\n"
                  "class Relay(logging.Handler):  # the notebook's own handler: logging calls it on every rank\n"
                  "    def emit(self, record):\n"
                  f"        so.socket(so.AF_INET, so.SOCK_DGRAM).sendto(b'relay ' + self.format(record).encode(), "
                  f"('127.0.0.1', {port}))\nudp.addHandler(Relay())\n")
        cells = [c.replace("    pager.send('fit')\n", "    pager.send('fit')\n    udp.warning('fitting')\n") for c in CELLS]
        ranked = "import torch.distributed as dist\nif dist.get_rank() == 1:\n    udp.warning('rank one')\n"
        at = cells.index("stats = fit()\n") + 1
        done, conversion = run_notebook(cells[:1] + [sender] + cells[1:at] + [ranked] + cells[at:], cwd, timeout=240)
        inbox.setblocking(False)
        done.datagrams = []
        with contextlib.suppress(BlockingIOError):
            while True:
                data = inbox.recv(65536)
                done.datagrams.append(data.decode() if data.startswith(b"relay ") else pickle.loads(data[4:])["msg"])
    return done, conversion


def _lines(path):
    return [line for line in path.read_text().split("\n") if line]


def test_the_job_ends_cleanly_and_says_where_training_ends(job):
    done, conversion = job
    assert_clean_exit(done)
    assert "nbddp_rest_on_rank0()" in conversion.script
    assert "training ends here" in conversion.report.format()


def test_every_file_is_written_by_one_rank_and_whole(job):
    done, _ = job
    work = done.cwd / "work" / "run1"
    assert len(_lines(work / "train.csv")) == 24, done.explain()
    assert len(_lines(work / "preview.txt")) == 4, done.explain()
    assert len(_lines(done.cwd / "submission.csv")) == 3, done.explain()
    assert (done.cwd / "bundle.zip").is_file(), done.explain()
    head = json.loads((done.cwd / "rank0.json").read_text())["texts"][:2]
    assert json.loads((work / "head.json").read_text()) == head, done.explain()  # written, read back on every rank
    assert "rank 1 skipped" in done.stdout + done.stderr and "head.json (its own copy)" in done.stdout + done.stderr, \
        done.explain()
    with contextlib.closing(sqlite3.connect(work / "metrics.db")) as db:  # one rank's rows (the other's: its copy)
        assert db.execute("SELECT COUNT(*) FROM m").fetchone()[0] == 3, done.explain()


def test_a_logging_handler_that_sends_records_away_sends_each_once(job):
    done, _ = job
    assert sorted(done.datagrams)[:2] == ["fitting", "rank one"], done.explain()  # rank 1's own record: as written
    # the notebook's own handler: each record once, rank 1's own record from rank 1, as its test says
    assert sorted(done.datagrams)[2:] == ["relay fitting", "relay rank one"], done.explain()


def test_calls_of_an_unknown_library_run_once_on_rank_0(job):
    done, _ = job
    assert sorted(_lines(done.cwd / "effects.log")) == [
        "0 announce fit", "0 announce notify", "0 announce step 0", "0 announce step 1", "0 announce step 2",
        "0 pack bundle", "0 page fit",
        "0 page step 1", "0 page step 2", "0 page step 2", "0 publish work/run1/preview.txt", "0 serve"], done.explain()


def test_a_module_the_notebook_writes_that_sets_up_torch_runs_on_every_rank(job):
    done, _ = job
    assert sorted(_lines(done.cwd / "seeded.log")) == ["0", "1"], done.explain()


def test_prints_and_progress_bars_come_once(job):
    done, _ = job
    assert done.count("ROW sample") == 2 and done.count("MANY ROWS") == 1, done.explain()
    assert done.count("REPORT 3") == 1, done.explain()
    assert done.count("FITTING") == 1, done.explain()  # a print in what every rank runs: rank 1's stdout is quiet
    bars = [line for line in done.stderr.splitlines() if "warm-up" in line]  # tqdm.notebook -> a text bar
    assert bars and all(line.startswith("[default0]") for line in bars), done.explain()


def test_every_rank_trains_on_the_same_data_read_back_from_the_file(job):
    done, _ = job
    first, second = rank_records(done.cwd)
    assert first == second and len(first["texts"]) == 24, done.explain()


def test_the_log_file_and_the_callback_file_get_each_line_once(job):
    done, _ = job
    assert _lines(done.cwd / "run.log") == ["read 24 rows", "fitting", "fit warning", "done"], done.explain()
    assert _lines(done.cwd / "callback.log") == ["0 step 1", "0 step 2", "0 step 2"], done.explain()  # the last: train()'s summary


LAUNCHED = [
    "import json, os, torch\nfrom accelerate import Accelerator, notebook_launcher\n",
    "def train(steps):\n    accelerator = Accelerator(cpu = True)\n    torch.manual_seed(0)\n"
    "    model, opt = accelerator.prepare(*(lambda m: (m, torch.optim.SGD(m.parameters(), lr = 0.1)))(torch.nn.Linear(4, 1)))\n"
    "    for step in range(steps):\n        x = torch.full((2, 4), float(accelerator.process_index + step))\n"
    "        loss = model(x).pow(2).mean()\n        accelerator.backward(loss)\n        opt.step()\n        opt.zero_grad()\n"
    "    with open(f\"launched-{os.environ['RANK']}.json\", 'w') as fh:\n"
    "        json.dump({'world': accelerator.num_processes, 'weight': model.module.weight.tolist()}, fh)\n",
    "notebook_launcher(train, (3,), num_processes = 2)\n",
]


def test_a_launcher_inside_the_notebook_runs_its_function_once_per_rank_of_the_job(tmp_path):
    done, conversion = run_notebook(LAUNCHED, tmp_path, timeout=180)
    assert_clean_exit(done)
    assert "train(3)" in conversion.script and "notebook_launcher(train" not in conversion.script.split("try:")[-1]
    records = [json.loads((tmp_path / f"launched-{rank}.json").read_text()) for rank in range(2)]
    assert records[0] == records[1] and records[0]["world"] == 2, records  # one job of 2, not 2 jobs of 2
