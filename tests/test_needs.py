"""Before/after tests for the whole notebook's rule (nbddp/needs.py, issue 37): every rank runs what training needs
and the process's set-up; everything else before training's end runs once on rank 0, whatever it calls; after
training's end rank 0 runs the rest alone. Each case beside what must not change; calls of libraries nbddp has no
name for, inside functions, through aliases, in loops and over cells.
"""
from __future__ import annotations

import textwrap

import pytest

from nbddp.transforms.base import Options
from test_transforms import REST, convert_cells

TRAIN = "trainer = Trainer(model=model, train_dataset=ds)\nstats = trainer.train()\n"
DONE = "done = True\n"  # a cell's last line that shows nothing (a call's value would be shown: nbddp_show)


def convert(*sources, **options):
    out, report = convert_cells(*(textwrap.dedent(s) for s in sources), options=Options(**options))
    again, _ = convert_cells(*out, options=Options(**options))  # converting converted code changes nothing more
    assert again == out
    return out, report


def once(code, word):
    body = textwrap.indent(textwrap.dedent(code), "    ")
    return f"if NBDDP_IS_MAIN:\n{body}nbddp_barrier(\"{word}\")\n"


@pytest.mark.parametrize("before, word", [
    ("import shutil\nshutil.rmtree('old_runs')\n", "rmtree"),                    # a file operation of the stdlib
    ("import requests\nrequests.post('https://x/hook', json={'start': 1})\n", "post"),  # a web call
    ("import os\nos.makedirs('out')\n", "makedirs"),                             # a folder, no exist_ok
    ("import os\nfor name in names:\n    os.makedirs(os.path.join(root, name))\n", "makedirs"),  # at computed paths
    ("import mylib\nreport = mylib.summarise(rows)\nmylib.send(report)\n", "summarise"),  # a library of its own
    ("for i in range(3):\n    print('row', i)\n", "print"),                    # a print in a loop
    ("if len(rows) > 3:\n    notify(rows[:3])\n", "notify"),                     # in an `if`
])
def test_what_training_does_not_need_runs_once(before, word):
    *lines, = textwrap.dedent(before).splitlines(keepends=True)
    imports = "".join(line for line in lines if line.startswith("import "))
    rest = "".join(line for line in lines if not line.startswith("import "))
    (cell, train), report = convert(before + DONE, TRAIN)
    assert cell == imports + once(rest, word) + DONE
    assert train == TRAIN
    assert any("training does not need it" in n.text for n in report.changes)


HOOK = "import requests\nimport notifylib as nl\nfrom transformers import Trainer\n"


@pytest.mark.parametrize("cell, guarded", [
    # inside a function that trains
    ("def run(ds):\n    requests.post('https://x/hook', json={'start': 1})\n"
     "    trainer = Trainer(model=model, train_dataset=ds)\n    trainer.train()\n    nl.send('done')\n"
     "    return trainer\ntr = run(ds)\n",
     ["        requests.post('https://x/hook', json={'start': 1})\n", "        nl.send('done')\n"]),
    # in a loop that trains, through a name of its own
    ("from notifylib import send as tell\ntr = Trainer(model=model, train_dataset=ds)\nfor epoch in range(2):\n"
     "    tr.train()\n    tell(f'epoch {epoch}')\n", ["        tell(f'epoch {epoch}')\n"]),
    # over cells: the loop in one cell, what it calls made in another
    ("def notify(text):\n    nl.send(text)\ntr = Trainer(model=model, train_dataset=ds)\nfor i in range(2):\n"
     "    tr.train()\n    if i:\n        notify('again')\n", ["            notify('again')\n"]),  # where it is called
    # a method of a value another library made, a value nothing else reads
    ("import slack_sdk\nclient = slack_sdk.WebClient(token='t')\ntr = Trainer(model=model, train_dataset=ds)\n"
     "for epoch in range(2):\n    tr.train()\n    client.chat_postMessage(channel='c', text=f'epoch {epoch}')\n",
     ["        client.chat_postMessage(channel='c', text=f'epoch {epoch}')\n"]),
    # the same in a callback's hook, the value kept on `self`
    ("from telegram import Bot as B\nfrom transformers import TrainerCallback\nclass Tell(TrainerCallback):\n"
     "    def __init__(self, token):\n        self.bot = B(token)\n"
     "    def on_epoch_end(self, args, state, control, **kw):\n        self.bot.send_message(chat_id=1, text='done')\n"
     "tr = Trainer(model=model, train_dataset=ds, callbacks=[Tell('t')])\ntr.train()\ndone = True\n",
     ["            self.bot.send_message(chat_id=1, text='done')\n"]),
    # a method of an attribute of such a value (`dk.containers.run`), through the notebook's function in the loop
    ("import dockerlib\ndk = dockerlib.from_env()\ntr = Trainer(model=model, train_dataset=ds)\n"
     "def launch(tag):\n    dk.containers.run('alpine', tag)\nfor epoch in range(2):\n    tr.train()\n"
     "    dk.images.prune()\n    launch(f'echo {epoch}')\n", ["        dk.images.prune()\n", "        dk.containers.run('alpine', tag)\n"]),
    # a function handed to a trainer, which calls it on every rank: metrics, rewards in a list (an alias), a collator
    ("def metrics(p):\n    nl.send('eval')\n    return {'a': 1}\n"
     "tr = Trainer(model=model, train_dataset=ds, compute_metrics=metrics)\nstats = tr.train()\n", ["        nl.send('eval')\n"]),
    ("import wandb\nwandb.init(project='p')\ndef metrics(p):\n    wandb.log({'acc': 1})\n    return {'acc': 1}\n"
     "tr = Trainer(model=model, train_dataset=ds, compute_metrics=metrics)\nstats = tr.train()\n",
     ["        wandb.log({'acc': 1})\n"]),  # (rank 1 would log with no run: wandb raises)
    ("from trl import GRPOTrainer as G\ndef reward(completions, **kw):\n"
     "    requests.post('https://x/hook', json={'n': len(completions)})\n    return [0.0] * len(completions)\n"
     "tr = G(model=model, reward_funcs=[reward], train_dataset=ds)\nstats = tr.train()\n",
     ["        requests.post('https://x/hook', json={'n': len(completions)})\n"]),
    ("def collate(rows):\n    for row in rows:\n        nl.send(str(row))\n    return rows\n"
     "tr = Trainer(model=model, train_dataset=ds, data_collator=collate)\nstats = tr.train()\n",
     ["            nl.send(str(row))\n"]),
    # given to a function that trains
    ("import discord_webhook as dw\nhook = dw.DiscordWebhook(url='u')\ndef run(ds, hook):\n"
     "    trainer = Trainer(model=model, train_dataset=ds)\n    trainer.train()\n    hook.execute()\n    return trainer\n"
     "tr = run(ds, hook)\n", ["        hook.execute()\n"]),
])
def test_effects_inside_what_trains_run_once(cell, guarded):
    """A line inside a function or loop that trains, calling a library none of training's, Python's or a computing
    one's for its effect alone, runs on rank 0 (no barrier: nothing another rank reads)."""
    out, report = convert(HOOK, cell)
    for line in guarded:
        assert "if NBDDP_IS_MAIN:\n" + line in out[1], out[1]
    assert "    nbddp_barrier" not in out[1] and ".train()\n" in out[1].replace("    ", ""), out[1]  # trains on every rank
    # (no barrier inside: a client only those lines use is made once, at the top level)
    assert "training does not need it" in report.format() or "in the callback's" in report.format()


@pytest.mark.parametrize("cells", [
    ["import dashlib\nsrv = dashlib.serve(port=8000)\n",
     "tr = Trainer(model=model, train_dataset=ds)\nfor i in range(2):\n    tr.train()\n    srv.push(i)\n"],
    ["from dashlib import serve as up\ndef start(port):\n    return up(port=port)\nboard = start(8000)\n",  # a function
     "def run(ds):\n    tr = Trainer(model=model, train_dataset=ds)\n    tr.train()\n    board.push('done')\nrun(ds)\n"],
    ["import dashlib\nsrv = dashlib.serve(port=8000)\n",  # in a callback's hook, over cells
     "from transformers import TrainerCallback\nclass Push(TrainerCallback):\n"
     "    def on_log(self, args, state, control, logs=None, **kw):\n        srv.push(logs)\n",
     "tr = Trainer(model=model, train_dataset=ds, callbacks=[Push()])\ntr.train()\n"],
])
def test_a_server_that_only_the_effects_inside_training_use_starts_once(cells):
    """The notebook starts a server (or a client) that only lines rank 0 runs alone use (pushes inside the loop, the
    function or the callback that trains): rank 0 starts it (before, every rank did: a second server on the port)."""
    out, report = convert("from transformers import Trainer\n", *cells)
    started = out[1]
    assert started.startswith(("import dashlib\nif NBDDP_IS_MAIN:\n", "from dashlib import serve as up\n")), out
    assert "if NBDDP_IS_MAIN:\n    board = start(8000)" in started or "if NBDDP_IS_MAIN:\n    srv = " in started, out
    assert "runs on every rank: training reads" not in report.format()


@pytest.mark.parametrize("line", [
    "    time.sleep(1)\n",                                   # Python's own: the process's business
    "    np.copyto(buffer, np.zeros(2))\n",                  # a computing library's: it may change what it is given
    "    with open(path, 'w') as fh:\n        yaml.dump(cfg, fh)\n",  # a file every rank opened
    "    client.extend([1])\n",                              # a method of a value: it may change it
    "    rows.refresh()\n",                                  # another library's value that training reads
    "    torch.cuda.empty_cache()\n",                        # training's own library
])
def test_what_may_matter_inside_what_trains_stays_on_every_rank(line):
    cell = ("import time, yaml, torch, rowlib\nimport numpy as np\nfrom transformers import Trainer\n"
            "rows = rowlib.Rows('r')\ntr = Trainer(model=model, train_dataset=rows)\nfor i in range(2):\n"
            "    tr.train()\n" + line)
    out = convert(cell)[0]  # the only line added: every rank takes rank 0's rows where they are plain values
    assert [out[0].replace('nbddp_same_values(globals(), "rows")\n', "")] == [cell], out


@pytest.mark.parametrize("setup", [
    "import os\nos.environ['WANDB_DISABLED'] = 'true'\n",
    "import random\nrandom.seed(3)\n" + DONE,
    "import warnings\nwarnings.filterwarnings('ignore')\n" + DONE,
    "import logging\nlogging.basicConfig(level=logging.INFO)\n" + DONE,
    "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\ntorch.set_float32_matmul_precision('high')\n" + DONE,
    "import os\nwith open(f\"log-{os.environ['RANK']}.txt\", 'w') as fh:\n    fh.write('mine')\n",  # the rank's own
])
def test_set_up_and_what_names_the_rank_run_on_every_rank(setup):
    assert convert(setup, TRAIN)[0] == [setup, TRAIN]


UNSLOTH_TRAIN = "trainer = UnslothTrainer(model=model, train_dataset=ds)\nstats = trainer.train()\n"


@pytest.mark.parametrize("setup", [
    "from unsloth import PatchFastRL, FastLanguageModel, UnslothTrainer\nPatchFastRL('GRPO', FastLanguageModel)\n",
    "import unsloth as us\nfrom unsloth import UnslothTrainer\ndef prepare():\n    us.PatchFastRL('GRPO', us.FastModel)\n"
    "prepare()\n",  # through the notebook's own function and an alias
    "import torch\nfrom unsloth import UnslothTrainer\ntorch.manual_seed(3)\n",
])
def test_a_function_of_a_library_training_comes_from_called_for_its_effect_runs_on_every_rank(setup):
    assert convert(setup + DONE, UNSLOTH_TRAIN)[0] == [setup + DONE, UNSLOTH_TRAIN]


@pytest.mark.parametrize("before, word", [
    ("from jobqueue import dispatch_jobs\ndispatch_jobs(['a', 'b'])\n", "dispatch_jobs"),  # "patch" inside a word
    ("import chattool as ct\nct.set_topic('fine-tuning')\n", "set_topic"),                # "set_" of another library
    ("import seedbank\nfor name in ['a', 'b']:\n    seedbank.enable_seed_log(name)\n", "enable_seed_log"),  # in a loop
])
def test_a_library_training_does_not_come_from_runs_once_whatever_its_names_say(before, word):
    *lines, = textwrap.dedent(before).splitlines(keepends=True)
    imports = "".join(line for line in lines if line.startswith(("import ", "from ")))
    rest = "".join(line for line in lines if not line.startswith(("import ", "from ")))
    (cell, train), report = convert("from unsloth import UnslothTrainer\n" + before + DONE, UNSLOTH_TRAIN)
    assert cell == "from unsloth import UnslothTrainer\n" + imports + once(rest, word) + DONE
    assert train == UNSLOTH_TRAIN


TRAIN_ROWS = "ds = Dataset.from_dict({'text': rows})\n" + TRAIN
ALIASED = [
    ["import random\nrows = [1, 2, 3]\n", "r = rows\nrandom.shuffle(r);\n", TRAIN_ROWS],          # an alias
    ["import random\nrows = [1, 2, 3]\n", "def prep():\n    random.shuffle(rows)\n", "prep();\n", TRAIN_ROWS],
    ["import random\nrows = [[1], [2]]\n", "for row in rows:\n    random.shuffle(row)\n", TRAIN_ROWS],  # a loop
]


@pytest.mark.parametrize("cells", ALIASED + [
    # a list filled in a loop, then shuffled in place, read by training
    ["import random\nrows = []\nfor i in range(8):\n    rows.append(f'text {i}')\nrandom.shuffle(rows)\n",
     "ds = Dataset.from_dict({'text': rows})\n" + TRAIN],
    # an attribute set on what training reads, over two cells
    ["tok = AutoTokenizer.from_pretrained('m')\n", "tok.pad_token = tok.eos_token\n",
     "trainer = Trainer(model=model, processing_class=tok)\nstats = trainer.train()\n"],
    # a value made by a call of the notebook's own function, read by a function the training's map calls
    ["def load_prompt():\n    return open('prompt.txt').read()\n", "PROMPT = load_prompt()\n",
     "def fmt(x):\n    return {'text': PROMPT.format(x['q'])}\n", "ds = ds.map(fmt)\n" + TRAIN],
])
def test_what_training_reads_runs_on_every_rank(cells):
    """(also: a change through an alias, inside the notebook's function, to the rows of a loop: ALIASED below)"""
    out, _ = convert(*cells)
    assert "NBDDP_IS_MAIN" not in "".join(out)
    assert out[-1].endswith("stats = trainer.train()\n")


def test_a_value_made_for_once_work_is_made_once():
    out, _ = convert("import mylib\npreview = mylib.render(rows[:3])\n", "mylib.upload(preview)\n" + DONE, TRAIN)
    assert out[:2] == ["import mylib\n" + once("preview = mylib.render(rows[:3])\n", "render"),
                       once("mylib.upload(preview)\n", "upload") + DONE]


@pytest.mark.parametrize("cells, end", [
    ([TRAIN, "import mylib\nmylib.serve(model)\nprint('done')\n"], 0),                   # a server after training
    (["go = trainer.train\n", "stats = go()\n", "model.save_pretrained('out')\nanswers = []\n"], 1),  # through an alias
    (["def run(lr):\n    trainer.args.learning_rate = lr\n    trainer.train()\n",
      "for lr in (1e-4, 2e-4):\n    run(lr)\n", "archive('out');\n"], 1),              # in a function, in a loop
    # a model loaded after training to try it, shown by print: nothing moved out of the print (rank 0 runs it alone)
    ([TRAIN, "def try_it(path):\n    m = AutoModelForCausalLM.from_pretrained(path, device_map=nbddp_device_map())\n"
             "    return m.generate(1)\n",
      "print(try_it('out'))\nfor p in ('a', 'b'):\n    print(try_it(p))\n"], 0),
])
def test_after_training_rank_0_runs_the_rest_alone(cells, end):
    out, report = convert(*cells)
    assert out[end].endswith(REST)
    assert out[end] == cells[end] + REST
    assert out[end + 1:] == cells[end + 1:]  # as the notebook wrote them: no guards, no barriers
    assert any("training ends here" in n.text for n in report.changes)


def test_a_notebook_that_trains_nothing_and_a_ddp_session_run_what_only_acts_outside_the_process_once():
    """No training's end to plan by (a notebook that does not train; `%ddp`, cell by cell, cannot know what later
    cells need): the vocabulary's rank-0 work, and what only acts outside the process (nbddp.alone), run on rank 0;
    the files it is given go to machines without rank 0's storage. The rest stays on every rank. Where a later cell
    makes a value of that library on every rank (`rows = mylib.fetch(...)`, after training too), the call was the
    library's set-up: every rank runs it (a `%ddp` session replays it then: nbddp/cellwise/history.py)."""
    download = "import mylib\n" + once("mylib.download('data')\n", "download") + 'nbddp_share_files("data")\n' + DONE
    untrained = ["import mylib\nmylib.download('data')\n" + DONE, "out = model.generate(x)\n"]
    assert convert(*untrained)[0] == [download, once("out = model.generate(x)\n", "generate")]
    cells = ["import mylib\nmylib.download('data')\n" + DONE, TRAIN, "print(len(mylib.fetch('out')))\n"]
    assert convert(*cells, whole=False)[0] == [download, TRAIN, once(cells[2], "print")]
    cells[2] = "rows = mylib.fetch('out')\n"
    assert convert(*cells, whole=False)[0] == [cells[0], TRAIN, cells[2]]


@pytest.mark.parametrize("loop, names", [
    ("for f in files:\n    requests.post(url, data=f)\n", '"f"'),                               # a web call
    ("for i, (src, dst) in enumerate(pairs):\n    mylib.send(src, dst, i)\n", '"dst", "i", "src"'),  # unpacked
    ("with mylib.Session('s') as session:\n    mylib.notify('start')\n", '"session"'),       # a library's `with`
    ("for n in range(3):\n    if n:\n        mylib.clean(f'old{n}')\n", '"n"'),             # in an `if`
])
def test_a_ddp_cells_loop_that_only_acts_outside_the_process_runs_once_and_every_rank_gets_its_names(loop, names):
    """`%ddp`, cell by cell: a later cell may read a loop's variable (or a `with`'s `as`), so rank 0's is given to
    every rank after the loop, which rank 0 runs alone."""
    head = "import requests, mylib\n"
    out, report = convert(head + loop + DONE, whole=False)
    assert f"if NBDDP_IS_MAIN:\n{textwrap.indent(loop, '    ')}nbddp_barrier(" in out[0], out[0]
    assert f"nbddp_share_values(globals(), {names})\n" in out[0], out[0]
    assert "a later cell may read" in report.format()
    computing = "rows = []\nfor f in files:\n    rows.append(f.upper())\n"  # what the notebook computes stays
    assert convert(computing + DONE, whole=False)[0] == [computing + DONE]


def test_a_name_a_block_binds_anew_is_every_ranks_there():
    """`fh` was made on rank 0 only by a once block; the training function's own `with ... as fh` makes it anew."""
    out, _ = convert("with open('notes.txt', 'w') as fh:\n    fh.write('x')\n",
                     "def fit():\n    with open(f'r{rank}.json', 'w') as fh:\n        json.dump(rows, fh)\n"
                     "    for fh in files:\n        fh.flush()\n    print('fit')\n    return trainer.train()\n",
                     "stats = fit()\n")
    assert out[1] == ("def fit():\n    with open(f'r{rank}.json', 'w') as fh:\n        json.dump(rows, fh)\n"
                      "    for fh in files:\n        fh.flush()\n    if NBDDP_IS_MAIN:\n        print('fit')\n"
                      "    return trainer.train()\n")


def on_each_machine(code, word, path="base"):
    return once(code, word) + f'nbddp_share_files("{path}")\n'  # a copy for machines without rank 0's storage


LOAD_BASE = "model = AutoModelForCausalLM.from_pretrained('./base')\n" + TRAIN
TRAIN_ARGS = "trainer = Trainer(model=model, args=args)\nstats = trainer.train()\n"
LOADED = "model = AutoModelForCausalLM.from_pretrained('./base', device_map=nbddp_device_map())\n" + TRAIN
BUILD = "base = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2))\n"


@pytest.mark.parametrize("cells, expected", [
    # built and saved in one cell, loaded from the folder by every rank in the next
    ([BUILD + "base.save_pretrained('base')\n", LOAD_BASE],
     [BUILD + on_each_machine("base.save_pretrained('base')\n", "save_pretrained"), LOADED]),
    # the path through a name, split over cells, written `./base/` in one place and `base` in the other
    (["OUT = 'base/'\n", BUILD, "base.save_pretrained(OUT)\n", LOAD_BASE],
     ["OUT = 'base/'\n", BUILD, on_each_machine("base.save_pretrained(OUT)\n", "save_pretrained"), LOADED]),
    # saved inside the notebook's own function, by keyword
    (["def build():\n    m = LlamaForCausalLM(LlamaConfig())\n    m.save_pretrained(save_directory='base')\n",
      "build();\n", LOAD_BASE],
     ["def build():\n    m = LlamaForCausalLM(LlamaConfig())\n    m.save_pretrained(save_directory='base')\n",
      on_each_machine("build();\n", "build"), LOADED]),
    # a tensor saved with torch.save and read back with torch.load
    (["import torch\nw = torch.randn(4)\ntorch.save(w, 'w.pt')\n",
      "w0 = torch.load('w.pt')\nmodel.init(w0)\n" + TRAIN],
     ["import torch\nw = torch.randn(4)\n" + on_each_machine("torch.save(w, 'w.pt')\n", "save", "w.pt"),
      "w0 = torch.load('w.pt')\nmodel.init(w0)\n" + TRAIN]),
    # read back by readers nbddp has no name for: `open` under json, a library of the notebook's own
    (["import json\ncfg = {'lr': 1}\nwith open('cfg.json', 'w') as fh:\n    json.dump(cfg, fh)\n",
      "args = json.load(open('cfg.json'))\n" + TRAIN_ARGS],
     ["import json\ncfg = {'lr': 1}\n" + on_each_machine("with open('cfg.json', 'w') as fh:\n    json.dump(cfg, fh)\n",
                                                         "open", "cfg.json"),
      "args = json.load(open('cfg.json'))\n" + TRAIN_ARGS]),
    (["import torch\nw = torch.randn(4)\ntorch.save(w, 'w.pt')\n", "import mylib\nmodel.init(mylib.read('w.pt'))\n" + TRAIN],
     ["import torch\nw = torch.randn(4)\n" + on_each_machine("torch.save(w, 'w.pt')\n", "save", "w.pt"),
      "import mylib\nmodel.init(mylib.read('w.pt'))\n" + TRAIN]),
])
def test_a_save_that_training_loads_back_is_made_on_every_rank_and_copied_to_each_machine(cells, expected):
    """What a save writes and training reads back by its path is what training needs: every rank makes it; rank 0
    saves it, and machines that do not see rank 0's storage get a copy (runtime/share.py)."""
    out, report = convert(*cells)
    assert out == expected
    assert any("machines that do not see rank 0's storage get a copy" in n.text for n in report.changes)


@pytest.mark.parametrize("cells", [
    [BUILD + "base.save_pretrained('base')\n" + DONE, "model = AutoModelForCausalLM.from_pretrained('other')\n" + TRAIN],
    [BUILD + "base.push_to_hub('me/base')\n" + DONE, "model = AutoModelForCausalLM.from_pretrained('me/base')\n" + TRAIN],
    [BUILD + "for name in ('a', 'base'):\n    base.save_pretrained(name)\n" + DONE, LOAD_BASE],  # a path it cannot read
])
def test_a_save_that_nothing_loads_an_upload_and_an_unknown_path_stay_once_per_job(cells):
    out, _ = convert(*cells)
    assert "nbddp_share_files" not in "".join(out)
    assert out[0].startswith("if NBDDP_IS_MAIN:\n    base = LlamaForCausalLM")  # training does not need it: once


def test_a_save_after_training_stays_on_rank_0():
    cells = [BUILD + "base.save_pretrained('base')\n", LOAD_BASE, "model.save_pretrained('base')\n"]
    out, _ = convert(*cells)
    assert out[2] == cells[2]  # after training's end: rank 0 alone


def test_a_save_two_functions_deep_is_followed_and_recursion_ends():
    chain = ["def a():\n    m = LlamaForCausalLM(LlamaConfig())\n    m.save_pretrained('base')\n", "def b():\n    a()\n",
             "b();\n", LOAD_BASE]
    out, _ = convert(*chain)
    assert out[2] == on_each_machine("b();\n", "b") and out[3] == LOADED
    recursive = ["def a(n):\n    if n:\n        b(n - 1)\n    m.save_pretrained('base')\n", "def b(n):\n    a(n)\n",
                 "b(2);\n", LOAD_BASE]  # a and b call each other: the analysis ends (it once recursed without end)
    assert convert(*recursive)[0][3] == LOADED


@pytest.mark.parametrize("call, every_rank", [
    ("random.shuffle(rows)", True),                      # changes what it is given
    ("import numpy as np\nnp.random.shuffle(rows)", True),
    ("def add(xs):\n    xs.append('x')\nadd(rows)", True),  # the notebook's own function may
    ("import json\njson.dump(rows, open('rows.json', 'w'))", False),  # reads what it is given: once
    ("import mylib\nmylib.summarise(rows)", False),
    ("import pprint as pp\npp.pprint(rows)", False),
])
def test_a_call_changes_what_it_is_given_where_its_entry_says_so(call, every_rank):
    import_random = "import random\n" if call.startswith("random") else ""
    (data, middle, train), _ = convert("rows = ['a', 'b']\n", import_random + call + "\n",
                                       "trainer = Trainer(model=model, train_dataset=rows)\nstats = trainer.train()\n")
    assert ("NBDDP_IS_MAIN" not in middle) == every_rank, middle


SEEDS = "%%writefile utils.py\nimport random\nimport torch\ndef set_seed(s):\n    random.seed(s)\n    torch.manual_seed(s)\n"
PINGS = "%%writefile tell.py\nimport requests\ndef ping(text):\n    requests.post('https://x/hook', json={'t': text})\n"


@pytest.mark.parametrize("cell", [
    "import utils\nutils.set_seed(42)\n" + DONE,
    "from utils import set_seed as seed_all\nseed_all(1)\n" + DONE,                       # through an alias
    "import utils\nfor part in range(2):\n    utils.set_seed(part)\n    trainer = Trainer(model=model, train_dataset=ds)\n"
    "    trainer.train()\n" + DONE,                                                         # in a loop that trains
])
def test_a_module_the_notebook_writes_is_what_its_code_calls_a_training_library_sets_up_every_rank(cell):
    out, report = convert(SEEDS, cell, TRAIN)
    assert out[1:] == [cell, TRAIN]
    assert "rank 0 only" not in report.format()


def test_a_module_the_notebook_writes_that_calls_another_library_runs_once():
    (_, cell, train), _ = convert(PINGS, "import tell as t\nt.ping('start')\n" + DONE, TRAIN)
    assert cell == "import tell as t\n" + once("t.ping('start')\n", "ping") + DONE and train == TRAIN


BOTH = ("%%writefile helpers.py\nimport random, torch, requests as rq\n\ndef seed(s):\n    random.seed(s)\n"
        "    torch.manual_seed(s)\n\ndef _post(text):\n    rq.post('https://x', data=text)\n\n"
        "def announce(text):\n    _post(text)\n")


@pytest.mark.parametrize("cell, every_rank, once_", [
    ("import helpers as hp\nhp.seed(0)\nhp.announce('start')\n", "hp.seed(0)\n", "hp.announce('start')"),
    ("from helpers import seed as s, announce as tell\ns(1)\ntell('go')\n", "s(1)\n", "tell('go')"),
    ("import helpers\ndef setup():\n    helpers.seed(2)\nsetup()\nfor e in range(2):\n    helpers.announce('e')\n",
     "setup()\n", "helpers.announce('e')"),
])
def test_each_function_of_a_module_the_notebook_writes_is_what_its_own_code_calls(cell, every_rank, once_):
    """One module that both imports torch (a seeding function: set-up, every rank) and posts (once): by function."""
    (_, out, train), _ = convert(BOTH, cell + DONE, TRAIN)
    assert every_rank in out and "if NBDDP_IS_MAIN:\n" in out and train == TRAIN, out
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if once_ in line)
    depth, enclosing = len(lines[at]) - len(lines[at].lstrip()), []
    for line in reversed(lines[:at]):  # the blocks the line is in, innermost first
        if line.strip() and len(line) - len(line.lstrip()) < depth:
            depth = len(line) - len(line.lstrip())
            enclosing.append(line.strip())
    assert "if NBDDP_IS_MAIN:" in enclosing, out


@pytest.mark.parametrize("module, guarded", [
    ("import requests\nclass Pager:\n    def send(self, text):\n        requests.post('https://x', json={'t': text})\n", True),
    ("import torch\nclass Pager:\n    def send(self, text):\n        torch.manual_seed(len(text))\n", False),
])
def test_a_value_of_a_module_the_notebook_writes_is_what_its_code_calls(module, guarded):
    loop = ("from pager import Pager\nfrom transformers import Trainer\np = Pager()\n"
            "tr = Trainer(model=model, train_dataset=ds)\nfor e in range(2):\n    tr.train()\n    p.send('epoch')\n")
    (_, cell), _ = convert("%%writefile pager.py\n" + module, loop)
    assert ("if NBDDP_IS_MAIN:\n        p.send('epoch')\n" in cell) is guarded, cell


BESIDE = {"utils.py": "import random\nimport torch\n\ndef set_seed(s):\n    random.seed(s)\n    torch.manual_seed(s)\n",
          "helpers/__init__.py": "from .core import seed_all\n",
          "helpers/core.py": "import numpy as np\nimport torch\n\ndef seed_all(s):\n    np.random.seed(s)\n"
                             "    torch.manual_seed(s)\n",
          "notify.py": "import requests\n\ndef ping(text):\n    requests.post('https://x/hook', json={'t': text})\n"}
BESIDE_TRAIN = "from transformers import Trainer\ntrainer = Trainer(model=model, train_dataset=ds)\ntrainer.train()\n"


@pytest.mark.parametrize("cells, every_rank", [
    (["import utils\nutils.set_seed(42)\n"], True),
    (["from helpers import seed_all as seed\n", "seed(1)\n"], True),             # a package, an alias, over cells
    (["import helpers.core\ndef prepare():\n    helpers.core.seed_all(3)\nprepare()\n"], True),  # in a function
    (["import notify as n\n", "for step in range(2):\n    n.ping(f'step {step}')\n"], False),  # in a loop: once
])
def test_a_module_beside_the_notebook_is_what_its_code_calls(tmp_path, cells, every_rank):
    from conftest import make_notebook
    import nbformat
    from nbddp.pipeline import convert_notebook

    for name, text in BESIDE.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    path = tmp_path / "nb.ipynb"
    nbformat.write(make_notebook(*cells, BESIDE_TRAIN), path)
    beside = convert_notebook(str(path)).cells
    alone = convert_notebook(make_notebook(*cells, BESIDE_TRAIN)).cells  # no folder: a library of its own
    last = len(cells) - 1
    assert ("NBDDP_IS_MAIN" not in beside[last].source) == every_rank, beside[last].source
    assert "NBDDP_IS_MAIN" in alone[last].source, alone[last].source


KIT = ("import numpy as np\nimport slack_sdk\nimport asrlib\nfrom transformers import Trainer\nclass Kit:\n"
       "    def __init__(self, m, d):\n        self.rng = np.random.default_rng(0)\n"
       "        self.client = slack_sdk.WebClient(token='t')\n        self.asr = asrlib.load_model('base')\n"
       "        self.trainer = Trainer(model=m, train_dataset=d)\n")


@pytest.mark.parametrize("cells, guarded", [
    # an attribute of the notebook's object, read outside its class, is the value its methods assign it
    (["kit = Kit(model, rows)\nkit.rng.shuffle(rows)\nkit.trainer.train()\n"], None),
    (["k = Kit(model, rows)\n", "def mix(box):\n    box.rng.shuffle(rows)\nmix(k)\nk.trainer.train()\n"],
     None),                                                                             # in a function, over cells
    (["kit = Kit(model, rows)\nfor e in range(2):\n    kit.trainer.train()\n"
      "    kit.client.chat_postMessage(channel='c', text='epoch')\n"], "kit.client.chat_postMessage"),  # once
    (["kit = Kit(model, rows)\nfor e in range(2):\n    kit.trainer.train()\n    kit.asr.to('cpu')\n"],
     None),                                                    # a device move of any value: every rank's memory
])
def test_an_attribute_of_the_notebooks_object_is_what_its_class_assigns(cells, guarded):
    out, _ = convert(KIT, *cells)
    code = "".join(out[1:])
    assert "nbddp_rest_on_rank0()" not in code.partition("trainer.train()")[0], code  # its trainer trains
    if guarded:
        assert f"if NBDDP_IS_MAIN:\n        {guarded}" in code, code
    else:
        assert "NBDDP_IS_MAIN" not in code, code


DEMO = "from datasets import load_dataset\n"


def test_data_preparation_read_by_training_over_cells_runs_main_process_first_on_every_rank():
    out, _ = convert(DEMO + "def get(path):\n    return load_dataset('json', data_files=path)\n",
                     "rows = get('train.json')\n", "ds = rows\n" + TRAIN)
    assert out[1] == "with nbddp_main_process_first():\n    rows = get('train.json')\n", out[1]


LOOP = ("import torch\nmodel = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size=2)\n")


@pytest.mark.parametrize("cells, end_after", [
    # the notebook's own loop: training ends after it, not before the line nbddp puts in front of it
    ([LOOP, "for epoch in range(2):\n    for x in loader:\n        loss = model(x).sum()\n        loss.backward()\n"
            "        opt.step()\n        opt.zero_grad()\n", "torch.save(model.state_dict(), 'm.pt')\n"],
     "opt.zero_grad()"),
    # a collective shown as the last thing every rank does: it runs everywhere, what shows it after training's end
    (["from transformers import Trainer\n", TRAIN, "print(trainer.evaluate())\n"], "nbddp_evaluate = trainer.evaluate()"),
])
def test_training_ends_where_the_plan_read_on_the_notebook_says(cells, end_after):
    out, _ = convert(*cells)
    code = "".join(out)
    assert REST in code, code
    assert code.index(end_after) < code.index(REST), code
    assert "nbddp_ddp(" not in code.partition(REST)[2], code  # the loop's own line stays before the end


def test_a_cells_last_value_of_no_call_is_shown_by_every_rank_without_a_wait():
    out, report = convert("prompt = 'Think first.'\nprompt\n", TRAIN)
    assert out[0] == "prompt = 'Think first.'\nnbddp_show(prompt)\n", out[0]  # nbddp_show prints on rank 0 alone
    assert not any("training does not need it" in n.text for n in report.changes)


@pytest.mark.parametrize("cells", [
    ["from unsloth import FastLanguageModel as FLM\nmodel, tok = FLM.from_pretrained('m')\n",
     "FLM.for_inference(model)\ninputs = tok(['hi'], return_tensors='pt')\n_ = model.generate(**inputs)\n",  # a demo
     "FLM.for_training(model)\n" + TRAIN],
    ["import torch\nfor epoch in range(2):\n    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n"  # trains
     "    torch.save(model.state_dict(), f'e{epoch}.pt')\n"],
])
def test_what_trains_or_is_rank_0_work_is_not_called_set_up(cells):
    """The report's set-up line names only a library's set-up: not a loop that trains (and saves), not the vocabulary's
    rank-0 work (Unsloth's switch to generation, which the rank guards put on rank 0)."""
    _, report = convert(*cells)
    said = [n for n in report.changes if "(set-up;" in n.text]
    assert all("for_training" in cells[-1] and n.cell == len(cells) for n in said), report.format()


@pytest.mark.parametrize("cell, line", [
    ("def check(m):\n    acc = float(m(x).mean())\n    with open('val.log', 'a') as fh:\n        fh.write(f'{acc}\\n')\n"
     "    return acc\nfor epoch in range(3):\n    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n"
     "    acc = check(model)\n    if acc > 0.9:\n        break\n", "    acc = check(model)\n"),
    ("def rl_step(batch):\n    out = model.generate(batch)\n    loss = scorer(out).mean()\n    loss.backward()\n"
     "    opt.step()\nfor b in batches:\n    rl_step(b)\n", "    out = model.generate(batch)\n"),  # in a function
    ("for step in range(2):\n    samples = model.generate(prompts)\n    loss = scorer(samples).mean()\n"
     "    loss.backward()\n    opt.step()\n", "    samples = model.generate(prompts)\n"),
])
def test_rank_0_work_whose_value_the_block_goes_on_with_runs_on_every_rank(cell, line):
    """Inside a loop or a function: a line that is rank-0 work but binds what a later line of the block reads on
    every rank (a test that leaves the loop, training) runs on every rank (before, rank 0 alone had the value: a
    NameError on the others); the runtime's one writer keeps what it writes once."""
    out, _ = convert(cell)
    indent = line[:len(line) - len(line.lstrip())]
    assert line in out[0] and f"{indent}if NBDDP_IS_MAIN:\n    {line}" not in out[0], out[0]


def test_rank_0_work_whose_value_only_rank_0_work_reads_stays_on_rank_0():
    out, _ = convert("for step in range(2):\n    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n"
                     "    out = model.generate(x)\n    print(tok.decode(out[0]))\n")
    assert "    if NBDDP_IS_MAIN:\n        out = model.generate(x)\n        print(tok.decode(out[0]))\n" in out[0], out[0]
