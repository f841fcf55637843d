"""Before/after tests for what the converter follows through the notebook's own code (issue 28): calls recognised by
what their names were imported or assigned as, effects through functions, lambdas, partials, methods and loops,
collectives inside prints, experiment trackers, GPU pins, and where errors point. Each idiom is written several ways
(inside a function, through an alias, in a loop, over two cells), with what must NOT change beside it.
"""
from __future__ import annotations

import textwrap

import pytest

from conftest import make_notebook
from nbddp.errors import ConversionError
from nbddp.transforms.base import Options
from test_transforms import convert_cells


def convert(*sources):
    """Cell by cell, as `%ddp` converts (Options.whole off): the vocabulary's following alone. What the whole
    notebook adds on top (nbddp.needs: the once default, training's end) is in test_needs.py."""
    return convert_cells(*(s if isinstance(s, tuple) else textwrap.dedent(s) for s in sources),
                         options=Options(whole=False))


def cells(befores, afters, name):
    """One idiom: the code cells a notebook holds, and those the script holds."""
    return pytest.param([textwrap.dedent(b) for b in befores], [textwrap.dedent(a) for a in afters], id=name)


NAMES = [
    # the builtins are not a dataset's map/filter
    cells(["xs = list(map(str, rows))\nys = list(filter(None, xs))\n"],
          ["xs = list(map(str, rows))\nys = list(filter(None, xs))\n"], "builtin map/filter"),
    cells(["ds = load_dataset('x')\nds = ds.filter(ok)\nn = len(list(filter(None, ds)))\n"],
          ["with nbddp_main_process_first():\n    ds = load_dataset('x')\n    ds = ds.filter(ok)\n"
           "n = len(list(filter(None, ds)))\n"], "dataset filter, builtin filter"),
    # a loader under the notebook's own names: an import alias, an assignment, across cells
    cells(["from unsloth import FastLanguageModel as FLM\n",
           "model, tok = FLM.from_pretrained('m')\nmodel = FLM.get_peft_model(model, target_modules=['lm_head'])\n"],
          ["from unsloth import FastLanguageModel as FLM\n",
           "model, tok = FLM.from_pretrained('m', device_map=nbddp_device_map())\nmodel = FLM.get_peft_model(model, "
           "target_modules=['lm_head'], temporary_location=f\"_unsloth_temporary_saved_buffers/rank{NBDDP_RANK}\")\n"],
          "alias get_peft_model"),
    cells(["from unsloth import FastLanguageModel\nLoader = FastLanguageModel\n"
           "m = Loader.get_peft_model(m, target_modules=['embed_tokens'])\n"],
          ["from unsloth import FastLanguageModel\nLoader = FastLanguageModel\n"
           "m = Loader.get_peft_model(m, target_modules=['embed_tokens'], "
           "temporary_location=f\"_unsloth_temporary_saved_buffers/rank{NBDDP_RANK}\")\n"], "assigned loader"),
    # a name imported from elsewhere is not Unsloth's loader
    # a generation pipeline's task through a name
    cells(["task = 'text-generation'\ngen = pipeline(task, model=model)\n"],
          ['task = \'text-generation\'\nif NBDDP_IS_MAIN:\n    gen = pipeline(task, model=model)\nnbddp_barrier("pipeline")\n'],
          "pipeline task through a name"),
    cells(["from mylib import FastLanguageModel as FLM\nm = FLM.get_peft_model(m, target_modules=['lm_head'])\n"],
          ["from mylib import FastLanguageModel as FLM\nm = FLM.get_peft_model(m, target_modules=['lm_head'])\n"],
          "not unsloth's loader"),
]

FUNCTIONS = [
    # trains and saves: runs on every rank, the save guarded where it stands (the first failure)
    cells(["def train_and_save():\n    trainer.train()\n    model.save_pretrained('out')\n", "train_and_save()\n"],
          ["def train_and_save():\n    trainer.train()\n    if NBDDP_IS_MAIN:\n        model.save_pretrained('out')\n"
           "    nbddp_barrier(\"save_pretrained\")\n", "train_and_save()\n"], "trains and saves, two cells"),
    # through a helper that saves, a method of the notebook's class, a lambda, a partial
    cells(["def save():\n    model.save_pretrained('out')\n\ndef run():\n    trainer.train()\n    save()\n\nrun()\n"],
          ["def save():\n    model.save_pretrained('out')\n\ndef run():\n    trainer.train()\n    if NBDDP_IS_MAIN:\n"
           "        save()\n    nbddp_barrier(\"save\")\n\nrun()\n"], "helper of a training function"),
    cells(["class Saver:\n    def save(self, path):\n        model.save_pretrained(path)\n\ns = Saver()\ns.save('o')\n"],
          ["class Saver:\n    def save(self, path):\n        model.save_pretrained(path)\n\ns = Saver()\n"
           "if NBDDP_IS_MAIN:\n    s.save('o')\nnbddp_barrier(\"save\")\n"], "method"),
    cells(["push = lambda: model.push_to_hub('me/m')\npush()\n"],
          ["push = lambda: model.push_to_hub('me/m')\nif NBDDP_IS_MAIN:\n    nbddp_show(push())\nnbddp_barrier(\"push\")\n"],
          "lambda"),
    cells(["from functools import partial\nsave = partial(model.save_pretrained, 'out')\nsave()\n"],
          ["from functools import partial\nsave = partial(model.save_pretrained, 'out')\nif NBDDP_IS_MAIN:\n    save()\n"
           "nbddp_barrier(\"save\")\n"], "partial"),
    # what a training function returns from rank-0 work: rank 0 must not skip the barrier, the others get None
    cells(["def fit_and_sample(x):\n    trainer.train()\n    out = model.generate(x)\n    return out\n\n"
           "def fit_and_answer(x):\n    trainer.train()\n    return model.generate(x), x\n"],
          ["def fit_and_sample(x):\n    trainer.train()\n    if NBDDP_IS_MAIN:\n        out = model.generate(x)\n"
           "    nbddp_barrier(\"generate\")\n    return out if NBDDP_IS_MAIN else None\n\n"
           "def fit_and_answer(x):\n    trainer.train()\n    return (model.generate(x), x) if NBDDP_IS_MAIN else None\n"],
          "returns rank-0 work"),
    cells(["for d in data:\n    trainer.train()\n    if good(d):\n        model.save_pretrained('best')\n        break\n"],
          ["for d in data:\n    trainer.train()\n    if good(d):\n        if NBDDP_IS_MAIN:\n"
           "            model.save_pretrained('best')\n        nbddp_barrier(\"save_pretrained\")\n        break\n"],
          "saves, then leaves the loop"),
    # a loop that trains and saves each epoch; a loop that trains and logs (no barrier per step)
    cells(["for epoch in range(3):\n    trainer.train()\n    model.save_pretrained(f'ep{epoch}')\n"],
          ["for epoch in range(3):\n    trainer.train()\n    if NBDDP_IS_MAIN:\n        model.save_pretrained(f'ep{epoch}')\n"
           "    nbddp_barrier(\"save_pretrained\")\n"], "loop trains and saves"),
    cells(["import wandb\nfor step in range(9):\n    loss = train_step()\n    wandb.log({'loss': loss})\n"],
          ["import wandb\nfor step in range(9):\n    loss = train_step()\n    if NBDDP_IS_MAIN:\n"
           "        wandb.log({'loss': loss})\n"], "loop logs, no barrier"),
    # a function that only prepares data runs main-process-first where it is called (Llama3.1 GRPO's
    # get_gsm8k_questions); one that also trains, or saves, or calls a function that trains, is left alone
    cells(["from datasets import load_dataset\ndef get(split='train'):\n    data = load_dataset('x')[split]\n"
           "    return data.map(lambda r: {'q': r['question']})\n", "dataset = get()\n"],
          ["from datasets import load_dataset\ndef get(split='train'):\n    data = load_dataset('x')[split]\n"
           "    return data.map(lambda r: {'q': r['question']})\n",
           "with nbddp_main_process_first():\n    dataset = get()\n"], "a function that only prepares data"),
    cells(["def prep_and_train():\n    ds = load_dataset('x')\n    SFTTrainer(model, train_dataset=ds).train()\n"
           "def prep_and_save():\n    ds = load_dataset('x')\n    torch.save(ds, 'ds.pt')\n"
           "def outer():\n    prep_and_train()\n    return load_dataset('y')\n",
           "prep_and_train()\nprep_and_save()\nouter()\n"],
          ["def prep_and_train():\n    ds = load_dataset('x')\n    SFTTrainer(model, train_dataset=ds).train()\n"
           "def prep_and_save():\n    ds = load_dataset('x')\n    if NBDDP_IS_MAIN:\n"
           "        torch.save(ds, 'ds.pt')\n    nbddp_barrier(\"save\")\n"
           "def outer():\n    prep_and_train()\n    return load_dataset('y')\n",
           "prep_and_train()\nprep_and_save()\nnbddp_show(outer())\n"], "functions that prepare data and do more"),
]

SHOWN = [
    cells(["print(trainer.evaluate())\n"],
          ["nbddp_evaluate = trainer.evaluate()\nif NBDDP_IS_MAIN:\n    print(nbddp_evaluate)\nnbddp_barrier(\"print\")\n"],
          "print(evaluate)"),
    cells(["print(f\"eval: {trainer.evaluate()['eval_loss']:.3f}\")\n"],
          ["nbddp_evaluate = trainer.evaluate()\nif NBDDP_IS_MAIN:\n    print(f\"eval: {nbddp_evaluate['eval_loss']:.3f}\")\n"
           "nbddp_barrier(\"print\")\n"], "f-string"),
    cells(["ev = trainer.evaluate\nshow = print\nshow(ev())\n"],
          ["ev = trainer.evaluate\nshow = print\nnbddp_ev = ev()\nif NBDDP_IS_MAIN:\n    show(nbddp_ev)\n"
           "nbddp_barrier(\"print\")\n"], "aliases of evaluate and print"),
    cells(["display(trainer.predict(test_ds).metrics)\n"],
          ["nbddp_predict = trainer.predict(test_ds)\nif NBDDP_IS_MAIN:\n    display(nbddp_predict.metrics)\n"
           "nbddp_barrier(\"display\")\n"], "display(predict)"),
    cells(["for split in splits:\n    print(trainer.evaluate(split))\n"],
          ["for split in splits:\n    nbddp_evaluate = trainer.evaluate(split)\n    if NBDDP_IS_MAIN:\n"
           "        print(nbddp_evaluate)\n"], "in a loop"),
    cells(["def report():\n    print(trainer.evaluate())\n", "report()\n"],
          ["def report():\n    nbddp_evaluate = trainer.evaluate()\n    if NBDDP_IS_MAIN:\n        print(nbddp_evaluate)\n",
           "report()\n"], "inside a function"),
    # a collective inside what saves: the save on rank 0, the collective (also as the receiver) on every rank
    cells(["torch.save(trainer.evaluate(), 'metrics.pt')\n"],
          ["nbddp_evaluate = trainer.evaluate()\nif NBDDP_IS_MAIN:\n    torch.save(nbddp_evaluate, 'metrics.pt')\n"
           "nbddp_barrier(\"save\")\n"], "torch.save(evaluate)"),
    cells(["for epoch in range(2):\n    trainer.train()\n    trainer.predict(test_ds).to_json(f'p{epoch}.json')\n"],
          ["for epoch in range(2):\n    trainer.train()\n    nbddp_predict = trainer.predict(test_ds)\n    if NBDDP_IS_MAIN:\n"
           "        nbddp_predict.to_json(f'p{epoch}.json')\n    nbddp_barrier(\"to_json\")\n"], "predict(...).to_json in a loop"),
    # a dataset's or DataFrame's files are written once
    cells(["ds = load_dataset('x')\n", "ds.save_to_disk('data')\n"],
          ["with nbddp_main_process_first():\n    ds = load_dataset('x')\n",
           "if NBDDP_IS_MAIN:\n    ds.save_to_disk('data')\nnbddp_barrier(\"save_to_disk\")\n"], "save_to_disk, two cells"),
    cells(["import pandas as pd\ndef dump(rows):\n    pd.DataFrame(rows).to_csv('rows.csv')\n\ndump(rows)\n"],
          ["import pandas as pd\ndef dump(rows):\n    pd.DataFrame(rows).to_csv('rows.csv')\n\nif NBDDP_IS_MAIN:\n"
           "    dump(rows)\nnbddp_barrier(\"dump\")\n"], "to_csv inside a function"),
]

TRACKERS = [
    cells(["import wandb\nrun = wandb.init(project='p')\n", "trainer.train()\nrun.log({'done': 1})\nwandb.finish()\n"],
          ["import wandb\nif NBDDP_IS_MAIN:\n    run = wandb.init(project='p')\n",
           "trainer.train()\nif NBDDP_IS_MAIN:\n    run.log({'done': 1})\n    wandb.finish()\n"], "wandb over two cells"),
    cells(["import mlflow as mf\nmf.start_run()\nmf.log_metric('a', 1)\nmf.end_run()\n"],
          ["import mlflow as mf\nif NBDDP_IS_MAIN:\n    mf.start_run()\n    mf.log_metric('a', 1)\n    mf.end_run()\n"],
          "mlflow alias"),
    cells(["from torch.utils.tensorboard import SummaryWriter\nw = SummaryWriter('runs')\n"
           "for i in range(3):\n    w.add_scalar('x', i, i)\nw.close()\n"],
          ["from torch.utils.tensorboard import SummaryWriter\nif NBDDP_IS_MAIN:\n    w = SummaryWriter('runs')\n"
           "for i in range(3):\n    if NBDDP_IS_MAIN:\n        w.add_scalar('x', i, i)\nif NBDDP_IS_MAIN:\n    w.close()\n"],
          "tensorboard"),
    cells(["import wandb\ndef fit():\n    trainer.train()\n    wandb.log({'done': 1})\n"],
          ["import wandb\ndef fit():\n    trainer.train()\n    if NBDDP_IS_MAIN:\n        wandb.log({'done': 1})\n"],
          "inside a training function"),
    cells(["import trackio\ntrackio.init(project='p')\ntrackio.log({'a': 1})\ntrackio.finish()\n"],
          ["import trackio\nif NBDDP_IS_MAIN:\n    trackio.init(project='p')\n    trackio.log({'a': 1})\n"
           "    trackio.finish()\n"], "trackio"),
]

DEVICES = [
    cells(["import torch\ntorch.cuda.set_device(0)\nx = x.cuda(0)\ny = y.to(0)\n"],
          ["import torch\ntorch.cuda.set_device(NBDDP_LOCAL_RANK)\nx = x.cuda(NBDDP_LOCAL_RANK)\ny = y.to(NBDDP_DEVICE)\n"],
          "set_device, cuda(0), to(0)"),
    cells(["def to_gpu(x):\n    return x.cuda(0)\n"], ["def to_gpu(x):\n    return x.cuda(NBDDP_LOCAL_RANK)\n"],
          "inside a function"),
    cells(["clf = pipeline('text-classification', model=m, device=0)\nz = torch.zeros(2, device='cuda:0')\n"
           "d = torch.device('cuda', 0)\n"],
          ["clf = pipeline('text-classification', model=m, device=NBDDP_DEVICE)\nz = torch.zeros(2, device=NBDDP_DEVICE)\n"
           "d = torch.device(NBDDP_DEVICE)\n"], "device= in any call"),
    cells(["device = 'cuda:0' if torch.cuda.is_available() else 'cpu'\n", "model.to(device)\n"],
          ["device = NBDDP_DEVICE if torch.cuda.is_available() else 'cpu'\n", "nbddp_show(model.to(device))\n"],
          "a device variable used in a later cell"),
    cells(["def put(m, gpu=0, device='cuda:1', steps=0):\n    return m.cuda(gpu).to(device)\n", "put(model)\n"],
          ["def put(m, gpu=NBDDP_LOCAL_RANK, device=NBDDP_DEVICE, steps=0):\n    return m.cuda(gpu).to(device)\n",
           "nbddp_show(put(model))\n"], "a parameter's default used as a device"),
    cells(["import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\nimport torch\n", "%env CUDA_VISIBLE_DEVICES=1\n"],
          ["import os\n# nbddp: removed CUDA_VISIBLE_DEVICES: each rank uses its own GPU\nimport torch\n",
           "# nbddp: removed CUDA_VISIBLE_DEVICES: each rank uses its own GPU\n"], "CUDA_VISIBLE_DEVICES"),
]

GUARDED = 'if NBDDP_IS_MAIN:\n    {} = model.generate(x)\nnbddp_barrier("generate")\n'
RANK0_VALUES = [
    # a name bound by a comprehension or a lambda is its own, not the rank-0-only value of the same name
    cells(["_ = model.generate(x)\n", "sums = [torch.zeros_like(m) for _ in range(world)]\ndist.all_gather(sums, m)\n"],
          [GUARDED.format("_"), "sums = [torch.zeros_like(m) for _ in range(world)]\nnbddp_show(dist.all_gather(sums, m))\n"],
          "comprehension's own _"),
    cells(["out = model.generate(x)\nsize = lambda out: len(out)\nn = {k: size(v) for k, v in rows.items()}\n"],
          [GUARDED.format("out") + "size = lambda out: len(out)\nn = {k: size(v) for k, v in rows.items()}\n"],
          "lambda's own parameter"),
    # ... but its iterable, and a name it does not bind, are the notebook's
    cells(["out = model.generate(x)\n", "texts = [t.strip() for t in out]\n"],
          [GUARDED.format("out"), 'if NBDDP_IS_MAIN:\n    texts = [t.strip() for t in out]\nnbddp_barrier("strip")\n'],
          "iterates over it"),
    cells(["out = model.generate(x)\ncheck = lambda t: t in out\n"],
          ['if NBDDP_IS_MAIN:\n    out = model.generate(x)\n    check = lambda t: t in out\nnbddp_barrier("generate")\n'],
          "lambda reads it"),
]

FILES = [
    # a file opened for writing is written once, by rank 0, before the others go on (they may read it)
    cells(["import json\nwith open('data.jsonl', 'w') as f:\n    for row in rows:\n        f.write(json.dumps(row))\n",
           "ds = load_dataset('json', data_files='data.jsonl')\n"],
          ["import json\nif NBDDP_IS_MAIN:\n    with open('data.jsonl', 'w') as f:\n        for row in rows:\n"
           "            f.write(json.dumps(row))\nnbddp_barrier(\"open\")\n",
           "with nbddp_main_process_first():\n    ds = load_dataset('json', data_files='data.jsonl')\n"],
          "with open, then read back"),
    cells(["out = open('log.txt', mode='a')\n", "out.write('x')\nout.close()\n"],
          ['if NBDDP_IS_MAIN:\n    out = open(\'log.txt\', mode=\'a\')\nnbddp_barrier("open")\n',
           'if NBDDP_IS_MAIN:\n    out.write(\'x\')\n    nbddp_show(out.close())\nnbddp_barrier("write")\n'], "handle over two cells"),
    cells(["import json\ndef dump(rows):\n    with open('x.json', 'w') as fh:\n        json.dump(rows, fh)\n\n",
           "for epoch in range(2):\n    trainer.train()\n    dump(rows)\n"],
          ["import json\ndef dump(rows):\n    with open('x.json', 'w') as fh:\n        json.dump(rows, fh)\n\n",
           "for epoch in range(2):\n    trainer.train()\n    if NBDDP_IS_MAIN:\n        dump(rows)\n"
           "    nbddp_barrier(\"dump\")\n"], "inside a function, in a loop"),
    cells(["write = open\nwith write('out.txt', 'wt') as f:\n    f.write('x')\n"],
          ['write = open\nif NBDDP_IS_MAIN:\n    with write(\'out.txt\', \'wt\') as f:\n        f.write(\'x\')\n'
           'nbddp_barrier("write")\n'], "through an alias"),
    cells(["path = 'data.jsonl'\nmode = 'w'\n", "with open(path, mode) as f:\n    f.write('x')\n"],
          ["path = 'data.jsonl'\nmode = 'w'\n",
           'if NBDDP_IS_MAIN:\n    with open(path, mode) as f:\n        f.write(\'x\')\nnbddp_barrier("open")\n'],
          "path and mode through names, over two cells"),
]

CONTEXTS = [
    # a tracker's run opened as a context around training: the run on rank 0, the training on every rank
    cells(["import mlflow\nwith mlflow.start_run():\n    trainer.train()\n    mlflow.log_metric('loss', 1.0)\n"],
          ["import mlflow\nwith (mlflow.start_run() if NBDDP_IS_MAIN else nbddp_no_context()):\n    trainer.train()\n"
           "    if NBDDP_IS_MAIN:\n        mlflow.log_metric('loss', 1.0)\n"], "mlflow run around train()"),
    cells(["import wandb\nwith wandb.init(project='p') as run, torch.no_grad():\n    trainer.train()\n    run.log({'a': 1})\n",
           "print(run.id)\n"],
          ["import wandb\nwith (wandb.init(project='p') if NBDDP_IS_MAIN else nbddp_no_context()) as run, torch.no_grad():\n"
           "    trainer.train()\n    if NBDDP_IS_MAIN:\n        run.log({'a': 1})\n",
           'if NBDDP_IS_MAIN:\n    print(run.id)\nnbddp_barrier("print")\n'], "wandb run as a context, read later"),
]

UNCHANGED = [
    "def normalize(x):\n    return x / x.sum()\n\ny = normalize(z)\n",  # a function that only computes
    "total = 0\nfor batch in loader:\n    total += batch.sum()\n",  # a loop that only computes
    "def save():\n    model.save_pretrained('x')\n\nif NBDDP_IS_MAIN:\n    save()\n",  # already under a rank test
    "if trainer.is_world_process_zero():\n    wandb.log({'a': 1})\n",
    "x = torch.ones(2, device='cpu')\ny = x.to('cpu')\nz = x.cuda()\nw = x.to('cuda')\n",  # no GPU number
    "label = 'cuda:0'\nprint_later = label\n",  # a string never used as a device
    "def loss_fn(p, y):\n    print(p)\n    return (p - y).abs().mean()\n",  # prints but trains nothing
    "squares = list(map(lambda v: v * v, range(4)))\n",
    "writer = frame.to_csv\nsaver = to_json\n",  # named, not called
    "nbddp_evaluate = trainer.evaluate()\nif NBDDP_IS_MAIN:\n    print(nbddp_evaluate)\nnbddp_barrier(\"print\")\n",
    "with open('data.txt') as f:\n    text = f.read()\nraw = open(p, 'rb').read()\nfh = open(p, mode)\n",  # reads
    "with open(f'pid-{os.environ[\"RANK\"]}', 'w') as f:\n    f.write(str(os.getpid()))\n",  # each rank's own file
]


@pytest.mark.parametrize("befores, afters", NAMES + FUNCTIONS + SHOWN + TRACKERS + DEVICES + RANK0_VALUES + FILES + CONTEXTS)
def test_idiom(befores, afters):
    converted, _ = convert(*befores)
    assert converted == afters
    again, report = convert(*converted)  # converting converted code changes nothing more
    assert again == converted and not report.warnings


@pytest.mark.parametrize("source", UNCHANGED, ids=[s.splitlines()[0][:40] for s in UNCHANGED])
def test_left_as_is(source):
    converted, report = convert(source)
    assert converted == [source]
    assert not report.warnings


@pytest.mark.parametrize("source, warning", [
    ("torch.cuda.set_device(args.gpu)\n", "cannot tell which GPU"),
    ("x = x.to(f'cuda:{gpu}')\n", "a GPU number computed by the notebook"),
    ("with open('log.txt', 'w') as log:\n    trainer.train()\n", "opens a block that also does work every rank"),
    ("with open('log.txt', 'w') as log: trainer.train()\n", "open(...) opens a block"),  # one line: not rank 0 only
    ("out = model.generate(x)\ntrainer = SFTTrainer(model=model, train_dataset=out)\n", "only rank 0 computed"),
])
def test_what_cannot_be_converted_safely_is_reported(source, warning):
    _, report = convert(source)
    assert any(warning in n.text for n in report.warnings), report.warnings


def test_reports_say_what_changed():
    _, report = convert("def go():\n    trainer.train()\n    model.push_to_hub('me/m')\n\ngo()\n",
                        "import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '0'\n", "print(trainer.evaluate())\n")
    text = report.format()
    assert "cell 1: rank 0 only: push_to_hub" in text
    assert "cell 2: removed `os.environ['CUDA_VISIBLE_DEVICES'] = '0'`" in text
    assert "cell 3: trainer.evaluate(...) runs on every rank" in text
    _, aliased = convert("from transformers import pipeline as pp\ntask = 'text-generation'\n",
                         "gen = pp(task, model=model)\n",
                         "with open(mode='w', file='notes.txt') as f:\n    f.write('x')\n")
    text = aliased.format()  # the pipeline and the file by their values, whatever the callee is called
    assert "cell 2: rank 0 only: pipeline('text-generation')" in text
    assert "cell 3: rank 0 only: writes 'notes.txt'" in text


def test_a_fault_names_the_step_cell_and_line(monkeypatch):
    """A bug in a tree step names the step, and the cell and line of the statement it was at."""
    from nbddp.transforms import scratch

    def broken(self, original, updated):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(scratch._Scratch, "leave_Call", broken)
    with pytest.raises(ConversionError, match=r"^cell 3, line 2: internal error in nbddp's scratch step "
                                              r"\(RuntimeError: boom\)") as err:
        convert("x = 1\n", ("markdown", "m"), "y = 2\nmodel = FastLanguageModel.get_peft_model(model)\n")
    assert "\n" not in str(err.value)


def test_nbformat_housekeeping_is_not_for_the_user(tmp_path):
    """Cells without ids (nbformat 4.5 wants them; nbformat fills them in) are not something to check."""
    import json

    from nbddp.pipeline import convert_notebook

    cell = {"cell_type": "code", "metadata": {}, "source": "x = 1\n", "outputs": [], "execution_count": None}
    path = tmp_path / "no_ids.ipynb"
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [cell]}))
    report = convert_notebook(str(path)).report
    assert not report.warnings and "Check these" not in report.format()


def test_a_cell_that_holds_a_marker_like_comment_keeps_it():
    """The script marks cells `# %% cell N`; a notebook's own such comment stays in its cell."""
    sources, _ = convert("x = 1\n# %% cell 9\ny = 2\n", "z = 3\n")
    assert sources == ["x = 1\n# %% cell 9\ny = 2\n", "z = 3\n"]


NOTEBOOKS = {
    "kaggle-style SFT with a tracker and GPU pins": [
        "%env CUDA_VISIBLE_DEVICES=0\n!pip install -q wandb\n",
        "import wandb, torch\nwandb.login(key = 'k')\nfrom unsloth import FastLanguageModel as FLM\nfrom trl import "
        "SFTConfig, SFTTrainer\nfrom datasets import load_dataset\ndevice = 'cuda:0'\n",
        "model, tokenizer = FLM.from_pretrained('unsloth/llama-3-8b-bnb-4bit', load_in_4bit = True)\n"
        "model = FLM.get_peft_model(model, r = 16, target_modules = ['q_proj', 'lm_head'])\n",
        "run = wandb.init(project = 'sft', config = {'lr': 2e-4})\nds = load_dataset('yahma/alpaca-cleaned', "
        "split = 'train')\nds = ds.map(fmt, batched = True)\nn = sum(map(len, ds['text']))\n",
        "trainer = SFTTrainer(model = model, tokenizer = tokenizer, train_dataset = ds,\n"
        "                     args = SFTConfig(output_dir = 'o', report_to = 'wandb'))\n",
        "def fit_and_save(path):\n    stats = trainer.train()\n    model.save_pretrained(path)\n"
        "    tokenizer.save_pretrained(path)\n    wandb.log({'loss': stats.training_loss})\n    return stats\n\n"
        "stats = fit_and_save('lora')\nprint(trainer.evaluate())\n",
        "inputs = tokenizer(['hi'], return_tensors = 'pt').to(device)\nout = model.generate(**inputs)\n"
        "print(tokenizer.decode(out[0]))\nwandb.finish()\n",
    ],
    "colab-style epochs with TensorBoard": [
        "import torch\nfrom torch.utils.tensorboard import SummaryWriter\ntorch.cuda.set_device(0)\n"
        "writer = SummaryWriter()\n",
        "for epoch in range(3):\n    trainer.train()\n    metrics = trainer.evaluate()\n"
        "    writer.add_scalar('eval/loss', metrics['eval_loss'], epoch)\n    trainer.save_model(f'ckpt-{epoch}')\n"
        "    print(f\"epoch {epoch}: {trainer.evaluate()['eval_loss']:.3f}\")\nwriter.close()\n",
    ],
}


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_of_idioms_keep_the_ddp_rules(name):
    """Whole notebooks of the idioms above, checked by the corpus tests' rule checker (the script's AST)."""
    import nbformat

    from nbddp.pipeline import convert_notebook
    from test_corpus import ddp_rule_problems

    cells = NOTEBOOKS[name]
    result = convert_notebook(nbformat.writes(make_notebook(*cells)))
    assert ddp_rule_problems(result.script, list(range(1, len(cells) + 1))) == []
    assert "# %%" not in result.report.format()  # the report quotes code, not the script's markers
    again = convert_notebook(nbformat.writes(make_notebook(*[c.source for c in result.cells])))
    assert [c.source for c in again.cells] == [c.source for c in result.cells] and not again.report.warnings


def test_a_custom_training_loop_is_a_backward_and_an_optimizer_step():
    """What the vocabulary and the analysis say of a loop (the custom-training-loop step builds on it)."""
    import libcst as cst

    from nbddp.effects import Effects
    from nbddp.meanings import Names
    from nbddp.vocabulary import BACKWARD, STEP

    module = cst.parse_module(
        "import torch\nfrom transformers import get_linear_schedule_with_warmup\n"
        "opt = torch.optim.AdamW(model.parameters())\nsched = get_linear_schedule_with_warmup(opt)\n"
        "def update(loss):\n    loss.backward()\n    opt.step()\n"
        "for batch in loader:\n    update(model(**batch).loss)\n    sched.step()\n"
        "for batch in loader:\n    sched.step()\n    total = batch.sum()\n")
    effects = Effects(Names(module))
    training, other = [s for s in module.body if isinstance(s, cst.For)]
    assert {BACKWARD, STEP} <= effects.of_node(training.body)
    assert not {BACKWARD, STEP} & effects.of_node(other.body)  # a scheduler's step is not an optimizer's


def test_display_is_rank_0_work_also_where_ipython_made_it_a_builtin(monkeypatch):
    import builtins

    monkeypatch.setattr(builtins, "display", print, raising=False)  # IPython's shell does so: %%torchrun, %ddp
    (cell,), _ = convert("display(df)\n")
    assert cell == 'if NBDDP_IS_MAIN:\n    display(df)\nnbddp_barrier("display")\n'
