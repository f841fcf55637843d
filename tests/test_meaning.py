"""Before/after tests for deciding by meaning (issue 47): rank and world tests by what they read, training's end by
what trains, training by the trainer's qualified class, a batch the notebook adapts to the world size kept, a
script the notebook runs outside the job. Each idiom in several spellings (a function, an alias, over cells), beside
what must not change. Converting converted code changes nothing more (nbddp.needs' tests' `convert`).
"""
from __future__ import annotations

import pytest

from test_needs import convert
from test_transforms import REST

SAVE = 'model.save_pretrained("out")\n'
TRAIN = "from trl import SFTTrainer\ntrainer = SFTTrainer(model=model, train_dataset=ds)\nstats = trainer.train()\n"


def _kept(cells):
    """The notebook's cells after conversion, the runtime's line of training's end left out."""
    out, report = convert(*cells)
    return [cell.replace(REST, "") for cell in out], out, report


@pytest.mark.parametrize("test", [
    "from accelerate import Accelerator\nacc = Accelerator()\nmain = acc.is_main_process\nif main:\n",
    "import os\ndef my_rank():\n    return int(os.environ.get('LOCAL_RANK', '0'))\nif my_rank() == 0:\n",
    "import torch.distributed as D\nif D.get_rank() == 0:\n",
    "if trainer.args.process_index == 0:\n",
])
def test_a_test_of_the_rank_by_what_it_reads_is_left_as_it_is(test):
    cell = test + "    " + SAVE
    cells, _, _ = _kept([TRAIN, cell])
    assert cells == [TRAIN, cell]


@pytest.mark.parametrize("lora", ["rank = 16\n", "local_rank = 8\n", "def rank():\n    return 16\n",
                                  "class Lora:\n    @property\n    def rank(self):\n        return 16\nrank = lambda: Lora().rank\n"])
def test_a_name_alone_is_no_rank_test(lora):
    test = "if rank() > 8:\n" if "def" in lora else f"if {lora.split()[0]} > 4:\n"
    (cell, train), report = convert(lora + test + "    " + SAVE, TRAIN)
    assert "NBDDP_IS_MAIN" in cell, "a LoRA rank is a number: the save under it is rank-0 work"


@pytest.mark.parametrize("after", [
    "if acc.process_index == 1:\n    open('one.txt', 'w').write('x')\n",
    "import os\nif int(os.environ['RANK']) == 1:\n    raise ValueError('rank 1 stops')\n",
    "def is_last():\n    return acc.process_index == acc.num_processes - 1\nif is_last():\n    print('last')\n",
    "import os as o\nrank_of = lambda: int(o.getenv('RANK', '0'))\nif rank_of() == 1:\n    open('a.txt', 'w').write('a')\n",
    "from torch import distributed as D\ndef my_rank():\n    return getattr(D, 'get_rank')() if D.is_initialized() else 0\n"
    "if my_rank() == 1:\n    open('b.txt', 'w').write('b')\n",
    "import torch.distributed as D\nclass Node:\n    @property\n    def rank(self):\n        return D.get_rank()\n"
    "node = Node()\nif node.rank == 1:\n    open('c.txt', 'w').write('c')\n",
    "import torch.distributed as D\nclass Node:\n    def where(self):\n        return D.get_rank()\n"
    "if Node().where() == 1:\n    open('c.txt', 'w').write('c')\n",
    "import functools, os\nwho = functools.partial(os.environ.get, 'LOCAL_RANK', '0')\nif who() == '1':\n"
    "    open('d.txt', 'w').write('d')\n",
    "state = trainer.accelerator\nif state.process_index == 1:\n    open('e.txt', 'w').write('e')\n",
    "if trainer.accelerator.process_index == 1:\n    open('e.txt', 'w').write('e')\n",
    "lead = getattr(acc, 'is_main_process')\nif not lead:\n    open('f.txt', 'w').write('f')\n",
    "KEY = 'process_index'\ndef which():\n    return getattr(acc, KEY, 0)\nif which() == 1:\n    open('g.txt', 'w').write('g')\n",
])
def test_per_rank_code_after_training_runs_on_every_rank(after):
    head = "from accelerate import Accelerator\nacc = Accelerator()\n"
    out, _ = convert(head + TRAIN, "print('trained')\n", after, "print('end')\n")
    assert _unblocked(out[2]) == after + REST and REST not in out[0] + out[1], out  # as it is, then training's end


@pytest.mark.parametrize("module, cell", [
    ("import os\ndef is_lead():\n    return int(os.environ.get('RANK', '0')) == 0\n",
     "from dist_info import is_lead\nif not is_lead():\n    open('notes.txt', 'a').write('x')\n"),
    ("import torch.distributed as dist\ndef rank():\n    return dist.get_rank() if dist.is_initialized() else 0\n"
     "def is_lead():\n    return rank() == 0\n",
     "import dist_info as di\nif not di.is_lead():\n    open('notes.txt', 'a').write('x')\n"),
    ("import os\ndef rank():\n    return int(os.environ['LOCAL_RANK'])\n",
     "from dist_info import rank as where\nfor _ in range(1):\n    if where() == 1:\n        open('n.txt', 'a').write('x')\n"),
])
def test_a_rank_test_through_a_module_of_the_notebooks_own_keeps_its_meaning(module, cell):
    """`%%writefile dist_info.py`: its functions that return the rank test it as the notebook's own would, after
    training's end too (before, rank 0 alone ran the test and its body never ran on rank 1)."""
    out, _ = convert("%%writefile dist_info.py\n" + module, TRAIN, cell, "print('end')\n")
    assert _unblocked(out[2]) == cell + REST and REST not in out[1], out  # as it is, then training's end


@pytest.mark.parametrize("read", ["getattr(acc, 'is_main_process')", "getattr(acc, 'local_process_index', 0) == 0",
                                  "acc.is_main_process"])
def test_a_rank_test_read_through_getattr_before_training_keeps_its_meaning(read):
    """Else the body goes under rank 0's guard and its barrier inside the test that rank 0 skips: the others hang."""
    out, _ = convert(f"from accelerate import Accelerator\nacc = Accelerator()\nlead = {read}\n",
                     "if not lead:\n    with open('helper.json', 'w') as fh:\n        fh.write('x')\n", TRAIN)
    assert _unblocked(out[1]) == "if not lead:\n    with open('helper.json', 'w') as fh:\n        fh.write('x')\n", out
    assert "NBDDP_IS_MAIN" not in out[0] + out[1], out


@pytest.mark.parametrize("cell, call", [
    ("import torch.distributed as dist\ndef finish():\n    if dist.get_rank() != 1:\n        return\n"
     "    model.save_pretrained('b')\nfinish()\n", "finish()"),
    ("import accelerate\nstate = accelerate.PartialState()\ndef note(path):\n    if state.process_index == 0:\n"
     "        return\n    open(path, 'w').write('x')\n", "note('n.txt')"),
    ("from accelerate import PartialState as PS\n@PS().on_process(process_index=1)\ndef one(path):\n"
     "    open(path, 'w').write('x')\n", "one('o.txt')"),
])
def test_a_function_that_decides_by_the_rank_runs_on_every_rank_after_training_too(cell, call):
    """Its call reads the rank (through the function's body): not rank-0 work, and training's end comes after it."""
    out, report = convert(TRAIN, cell if cell.endswith(f"{call}\n") else cell + call + "\n", "print('end')\n")
    code = "".join(out)
    assert f"if NBDDP_IS_MAIN:\n    {call}" not in code and f"\n{call}\n" in code, code
    assert code.index(f"\n{call}\n") < code.index(REST), code


def _unblocked(code):
    """The code without the runtime's `with nbddp_rank_block():` lines (their blocks one level out)."""
    out, block = [], None  # the indentation of the block line being undone
    for line in code.splitlines(keepends=True):
        depth = len(line) - len(line.lstrip())
        if block is not None and line.strip() and depth <= block:
            block = None
        if line.strip() == "with nbddp_rank_block():":
            block = depth
        else:
            out.append(line[4:] if block is not None else line)
    return "".join(out)


@pytest.mark.parametrize("says, shown", [
    ("import torch.distributed as dist\nme = dist.get_rank()\nprint('rank', me)\n", "print('rank', me)"),
    ("import os\ndef where():\n    return f\"{os.environ['LOCAL_RANK']} of {os.environ['WORLD_SIZE']}\"\n"
     "print(where())\n", "print(where())"),
    ("from accelerate import Accelerator as A\nstate = A()\nprint(f'process {state.process_index}')\n",
     "print(f'process {state.process_index}')"),
])
def test_a_print_of_the_rank_runs_on_every_rank(says, shown):
    out, _ = convert(TRAIN, "print('trained')\n" + says)
    lines = out[1].splitlines()
    assert shown in lines, out  # at the top level: each rank says its own
    assert "    print('trained')" in lines, out  # the same line on every rank: once


def test_the_waits_of_a_notebook_written_for_accelerate_meet_every_rank():
    loop = ("for x, y in data:\n    loss = loss_fn(model(x), y)\n    accelerator.backward(loss)\n    opt.step()\n"
            "    opt.zero_grad()\n")
    cells = ["from accelerate import Accelerator\naccelerator = Accelerator()\n"
             "model, opt, data = accelerator.prepare(model, opt, data)\n", loop,
             "accelerator.wait_for_everyone()\nunwrapped = accelerator.unwrap_model(model)\n",
             "print('done')\n"]
    out, _ = convert(*cells)
    assert out[2].startswith("accelerator.wait_for_everyone()\n" + REST) and REST not in "".join(out[:2]), out


@pytest.mark.parametrize("later", [
    "from unsloth import FastLanguageModel\nmodel2, tok2 = FastLanguageModel.from_pretrained('out')\n",
    "from transformers import AutoModelForCausalLM as AM\ndef load(path):\n    return AM.from_pretrained(path)\n"
    "tried = load('out')\n",
    "from peft import PeftModel\nfor path in ['out']:\n    tried = PeftModel.from_pretrained(model, path)\n",
])
def test_a_model_loaded_after_training_to_try_it_out_does_not_move_trainings_end(later):
    out, _ = convert(TRAIN, later + "print('tried')\n")
    assert out[0].endswith(REST), out


def test_a_model_loaded_then_trained_again_moves_trainings_end():
    again = "from unsloth import FastLanguageModel\nmodel2, tok2 = FastLanguageModel.from_pretrained('out')\n" \
            "trainer2 = SFTTrainer(model=model2, train_dataset=ds)\nstats2 = trainer2.train()\n"
    out, _ = convert(TRAIN, again, "print('done')\n")
    assert not out[0].endswith(REST) and out[1].endswith(REST), out


@pytest.mark.parametrize("cells", [
    ["from sklearn.linear_model import LogisticRegression\nprobe = LogisticRegression()\nprobe.fit(X, y)\n"],
    ["import sklearn.cluster as sc\nkm = sc.KMeans(3)\nfor _ in range(2):\n    km.fit(X)\n"],
    ["import torch\nnet = torch.nn.Linear(2, 2)\nnet.train()\n"],
])
def test_fit_and_train_of_values_that_are_not_trainers_are_not_training(cells):
    out, _ = convert(TRAIN, *cells)
    assert out[0].endswith(REST), out


@pytest.mark.parametrize("cells", [
    ["from trl import SFTTrainer\ndef make():\n    return SFTTrainer(model=model, train_dataset=ds)\n",
     "t = make()\n", "t.train()\n"],
    ["import trl\nclass MyTrainer(trl.SFTTrainer):\n    pass\n", "t = MyTrainer(model=model)\nt.train()\n"],
    ["from lightning import Trainer as LT\nrunner = LT(max_epochs=1)\n", "runner.fit(module)\n"],
    ["from unsloth.chat_templates import train_on_responses_only\nfrom trl import SFTTrainer\n"
     "t = SFTTrainer(model=model)\nt = train_on_responses_only(t)\n", "t.train()\n"],
    ["from transformers import Trainer\nt = Trainer(model=model)\nphases = {'fit': t.train, 'eval': lambda: None}\n",
     "for phase in ('fit', 'eval'):\n    phases[phase]()\n"],
    ["from trl import SFTTrainer\nsteps = [SFTTrainer(model=model).train]\n", "for step in steps:\n    step()\n",
     "steps[0]()\n"],
    ["import torch.distributed as D\nclass Meter:\n    def synced(self, t):\n        op = getattr(D, 'all_reduce')\n"
     "        op(t)\n        return t\n", "total = Meter().synced(loss)\n"],
    # a function of the notebook's that a library's method runs now (a search's objective; a lambda; an executor)
    ["import optuna\ndef objective(trial):\n    loss.backward()\n    opt.step()\n    return 0.0\n"
     "study = optuna.create_study()\n", "study.optimize(objective, n_trials=2)\n"],
    ["import optuna as o\ndef fit(lr):\n    loss.backward()\n    return 0.0\ns = o.create_study()\n",
     "s.optimize(lambda t: fit(t.suggest_float('lr', 0.1, 1.0)), n_trials=2)\n"],
    ["from concurrent.futures import ThreadPoolExecutor\ndef step():\n    loss.backward()\n    opt.step()\n",
     "with ThreadPoolExecutor(1) as ex:\n    done = ex.submit(step).result()\n"],
    # Lightning's evaluation after fit (its test_step may log with sync_dist: every rank)
    ["import lightning as L\ntrainer = L.Trainer(max_epochs=1)\ntrainer.fit(model, dl)\n",
     "scores = trainer.validate(model, dl)\n"],
    ["import pytorch_lightning as pl\ntr = pl.Trainer()\ntr.fit(model, dl)\n",
     "def final(t):\n    return t.test(model, dl)\nresults = final(tr)\n"],
    # a function accelerate's notebook_launcher runs (the script runs it once on each rank): through an alias
    ["from accelerate import notebook_launcher as launch\ndef train_fn():\n    loss.backward()\n    opt.step()\n",
     "launch(train_fn, (), num_processes=2)\n"],
    ["def train_fn(steps):\n    for _ in range(steps):\n        loss.backward()\n",
     "import accelerate\naccelerate.notebook_launcher(train_fn, (3,), num_processes=2)\n"],
    # a function of a module of the notebook's own (%%writefile): through an alias, the notebook's function, a loop
    ["%%writefile fit_lib.py\nfrom transformers import Trainer\ndef go(m, d):\n    Trainer(model=m, train_dataset=d).train()\n",
     "import fit_lib\nfit_lib.go(model, data)\n"],
    ["%%writefile fit_lib.py\ndef step(loss, opt):\n    loss.backward()\n    opt.step()\n",
     "from fit_lib import step as one_step\ndef epoch(batches):\n    for b in batches:\n        one_step(model(b).sum(), opt)\n"
     "epoch(data)\n"],
    ["%%writefile fit_lib.py\nimport torch.distributed as dist\ndef _sync(t):\n    dist.all_reduce(t)\n"
     "def average(t):\n    _sync(t)\n    return t\n", "import fit_lib as fl\ntotal = fl.average(loss)\n"],
])
def test_training_through_a_function_a_subclass_or_another_library(cells):
    out, _ = convert(*cells, "print('done')\n")
    assert out[-2].endswith(REST) and REST not in "".join(out[:-2]), out


@pytest.mark.parametrize("cells, written", [
    (["import os\nworld = int(os.environ.get('WORLD_SIZE', 1))\n",
      "from trl import SFTConfig\nargs = SFTConfig(output_dir='o', gradient_accumulation_steps=8 // world)\n"],
     "gradient_accumulation_steps=nbddp_batch_as_written(8 // world)"),
    (["from accelerate import PartialState\nfrom transformers import TrainingArguments as TA\n",
      "args = TA(output_dir='o', per_device_train_batch_size=16 // PartialState().num_processes)\n"],
     "gradient_accumulation_steps=nbddp_batch_as_written(1)"),
    (["import torch.distributed as dist\ndef n():\n    return dist.get_world_size() if dist.is_initialized() else 1\n",
      "from trl import GRPOConfig\nsteps = max(1, 4 // n())\nargs = GRPOConfig(output_dir='o', gradient_accumulation_steps=steps)\n"],
     "gradient_accumulation_steps=nbddp_batch_as_written(steps)"),
    # the accumulation in a mapping the config is given as **kwargs: set by key, in dict(), in a display, beside it
    (["from accelerate import PartialState\nfrom transformers import TrainingArguments\n"
      "def per_process(total):\n    return max(1, total // PartialState().num_processes)\n",
      "hp = dict(output_dir='o')\nhp['gradient_accumulation_steps'] = per_process(8)\nargs = TrainingArguments(**hp)\n"],
     "hp['gradient_accumulation_steps'] = nbddp_batch_as_written(per_process(8))"),
    (["import os\nfrom trl import SFTConfig\nn = int(os.environ['WORLD_SIZE'])\n",
      "kw = dict(output_dir='o', gradient_accumulation_steps=8 // n)\nargs = SFTConfig(**kw, max_steps=2)\n"],
     "gradient_accumulation_steps=nbddp_batch_as_written(8 // n))"),
    (["import torch.distributed as D\nfrom transformers import TrainingArguments as TA\nworld = D.get_world_size()\n",
      "cfg = {'output_dir': 'o', 'gradient_accumulation_steps': 16 // world}\nargs = TA(**cfg)\n"],
     "'gradient_accumulation_steps': nbddp_batch_as_written(16 // world)}"),
    (["import os\nfrom trl import SFTConfig\nn = int(os.environ['WORLD_SIZE'])\nkw = dict(output_dir='o')\n",
      "args = SFTConfig(**kw, gradient_accumulation_steps=8 // n)\n"],
     "gradient_accumulation_steps=nbddp_batch_as_written(8 // n))"),
    (["import torch.distributed as D\nfrom trl import SFTConfig\nhp = {'output_dir': 'o'}\n",  # the batch, by key
      "hp['per_device_train_batch_size'] = 16 // D.get_world_size()\nargs = SFTConfig(**hp)\n"],
     "hp['per_device_train_batch_size'] = nbddp_batch_as_written(16 // D.get_world_size(), "
     "\"per_device_train_batch_size\")"),
    (["from accelerate import PartialState\nfrom transformers import TrainingArguments\n"
      "args = TrainingArguments(output_dir='o')\n",  # set on the config after it was made
      "args.gradient_accumulation_steps = 8 // PartialState().num_processes\n"],
     "args.gradient_accumulation_steps = nbddp_batch_as_written(8 // PartialState().num_processes)"),
    # the GPUs a one-process notebook spreads its batch over (a Trainer's n_gpu): through an alias, in a function
    (["from torch.cuda import device_count as gpus\nfrom trl import SFTConfig\n",
      "args = SFTConfig(output_dir='o', gradient_accumulation_steps=max(1, 8 // gpus()))\n"],
     "gradient_accumulation_steps=nbddp_batch_as_written(max(1, 8 // gpus())))"),
    (["import torch\nfrom transformers import TrainingArguments\ndef accumulation(total):\n"
      "    return total // max(1, torch.cuda.device_count())\n",
      "args = TrainingArguments('o', gradient_accumulation_steps=accumulation(16))\n"],
     "gradient_accumulation_steps=nbddp_batch_as_written(accumulation(16)))"),
    # a function of a module of the notebook's own (%%writefile), through another of its functions
    (["%%writefile dist_info.py\nimport os\ndef _size():\n    return int(os.environ.get('WORLD_SIZE', '1'))\n"
      "def world():\n    return max(1, _size())\n",
      "import dist_info as di\nfrom trl import SFTConfig\nargs = SFTConfig(output_dir='o', gradient_accumulation_steps=16 // "
      "di.world())\n"],
     "gradient_accumulation_steps=nbddp_batch_as_written(16 // di.world()))"),
])
def test_a_batch_the_notebook_adapts_to_the_world_size_is_kept_as_written(cells, written):
    out, report = convert(*cells)
    assert written in out[1], out[1]
    assert "follow" in report.format() and "the world size already" in report.format()


@pytest.mark.parametrize("later", [
    "args.gradient_accumulation_steps //= args.world_size\n",
    "args.gradient_accumulation_steps = args.gradient_accumulation_steps // args.world_size\n",
    "import os\ndef adapt(a):\n    setattr(a, 'gradient_accumulation_steps', 16 // int(os.environ['WORLD_SIZE']))\nadapt(args)\n",
])
def test_a_config_whose_batch_a_later_line_adapts_to_the_world_size_is_made_as_written(later):
    """Else the runtime divides the config's 16 when it is made and the notebook's line divides the 8 again."""
    out, report = convert("from transformers import TrainingArguments\n"
                          "args = TrainingArguments('o', gradient_accumulation_steps=16)\n", later)
    assert "gradient_accumulation_steps=nbddp_batch_as_written(16))" in out[0], out
    assert "the world size already" in report.format()


def test_a_count_of_gpus_after_training_is_no_test_of_the_ranks():
    """`torch.cuda.device_count()` counts as the world for the batch alone: read after training (a report, a hook),
    it does not move training's end there, and the hook that sends it still runs once."""
    out, _ = convert(TRAIN, "import torch, requests\nn = torch.cuda.device_count()\n"
                            "requests.post('https://x/hook', json={'gpus': n})\n")
    assert out[0].endswith(REST) and REST not in out[1], out


def test_a_batch_of_literals_is_left_to_the_runtime():
    out, _ = convert("from trl import SFTConfig\nargs = SFTConfig(output_dir='o', gradient_accumulation_steps=4)\n",
                     "hp = dict(output_dir='o', gradient_accumulation_steps=8)\nhp['gradient_accumulation_steps'] = 4\n"
                     "world_size = 2\nhp.update(gradient_accumulation_steps=8 // world_size)\nargs = SFTConfig(**hp)\n")
    assert "nbddp_batch_as_written" not in "".join(out)


@pytest.mark.parametrize("cell, said", [
    ("!python train.py --epochs 1\n", "`!python train.py --epochs 1` runs a Python program"),
    ("import sys\n!{sys.executable} -u train.py\n", "-u train.py` runs a Python program"),
    ("%%bash\ncd work\npython3 -m mypkg.train\n", "`python3 -m mypkg.train` runs a Python program"),
    # through Python: in a function, one string, a shell
    ("import subprocess as sp, sys\ndef go(n):\n    sp.run([sys.executable, 'train.py', f'--n={n}'])\ngo(1)\n",
     "`sp.run([sys.executable, 'train.py', f'--n={n}'])` runs a Python program"),
    ("import os\nos.system('python3 train.py --epochs 2')\n", "`os.system('python3 train.py --epochs 2')` runs a Python"),
    ("from subprocess import check_output\nout = check_output('python -m mypkg.eval', shell=True)\n",
     "`check_output('python -m mypkg.eval', shell=True)` runs a Python program"),
])
def test_a_python_program_the_notebook_runs_is_said_to_run_outside_the_job(cell, said):
    _, report = convert(cell)
    assert said in report.format() and "outside this job" in report.format()


@pytest.mark.parametrize("cell", [
    # arguments the converter cannot read: in a loop, in a function through an alias, a module's run
    "import subprocess, sys\nfor lr in [1e-4, 2e-4]:\n    subprocess.run([sys.executable, 'train.py', str(lr)])\n",
    "import subprocess as sp\nimport sys\ndef sweep(seeds):\n    for s in seeds:\n"
    "        sp.check_call([sys.executable, '-m', 'mypkg.train', '--seed', str(s)])\nsweep(range(3))\n",
    "from subprocess import call\nimport sys\nname = input()\ncall([sys.executable, 'eval.py', '--name', name])\n",
])
def test_a_python_program_given_values_it_cannot_read_runs_once(cell):
    out, report = convert(cell)
    assert "if NBDDP_IS_MAIN:" in "".join(out) and "outside this job" in report.format(), "".join(out)


def test_a_program_whose_module_it_cannot_read_stays_every_ranks_and_a_launch_with_values_stops():
    out, report = convert("import subprocess, sys\nmod = input()\nsubprocess.run([sys.executable, '-m', mod])\n")
    assert "NBDDP_IS_MAIN:" not in "".join(out) and "outside this job" not in report.format()  # pip, maybe
    with pytest.raises(Exception, match="starts a distributed job of its own"):
        convert("import subprocess\nn = 2\nsubprocess.run(['torchrun', '--nproc_per_node', str(n), 'train.py'])\n")


def test_other_shell_lines_are_not_said_to_run_outside_the_job():
    _, report = convert("!ls -la\n!pip install x\n")
    assert "outside this job" not in report.format()
    _, report = convert("import subprocess, os\nsubprocess.run(['ls', '-la'])\n"  # not Python, or its own environment
                        "subprocess.run(['python', 'x.py'], env={'A': '1'})\n")
    assert "outside this job" not in report.format()


GIVE_TRAIN = "from trl import SFTTrainer\ntrainer = SFTTrainer(model=model, train_dataset=rows)\nstats = trainer.train()\n"


@pytest.mark.parametrize("cell, names", [
    ("rows = []\nfor p in prompts:\n    out = model.generate(p)\n    rows.append(tok.decode(out[0]))\n", ["rows"]),
    ("def synth(n):\n    return [tok.decode(model.generate(x)[0]) for x in range(n)]\nrows = synth(4)\n", ["rows"]),
    ("import uuid\nrows = [f'run-{uuid.uuid4().hex}']\n", ["rows"]),
    ("from datetime import datetime as dt\nstamp = dt.now().strftime('%H%M%S')\nrows = [stamp]\n", ["stamp"]),
    ("import tempfile as tf\nwork = tf.mkdtemp()\nrows = [work]\n", ["work"]),  # a folder of a random name
    ("import time\ndef stamp():\n    return int(time.monotonic_ns())\nrows = [stamp() % 100]\n", ["rows"]),  # a clock
    ("from threading import get_native_id as me\nrows = [me() % 7 for _ in range(2)]\n", ["rows"]),  # the thread
    # draws from the OS's entropy: each draw is the process's own (the generator itself is no value to give)
    ("import random\nsr = random.SystemRandom()\nrows = [sr.randint(0, 9) for _ in range(4)]\n", ["rows"]),
    ("from random import SystemRandom as SR\ndef pick(xs):\n    return SR().sample(xs, 2)\nrows = pick([1, 2, 3])\n",
     ["rows"]),
    ("import random\nrows = [1, 2, 3]\nrandom.SystemRandom().shuffle(rows)\n", ["rows"]),
    ("import secrets\nrows = [secrets.SystemRandom().randint(0, 9)]\n", ["rows"]),  # random's class, by secrets
    ("import pandas as pd\nstamp = pd.Timestamp.now().strftime('%H%M%S')\nrows = [stamp]\n", ["stamp"]),  # pandas' clock
    ("import multiprocessing as mp\nrows = [mp.current_process().pid]\n", ["rows"]),  # the process, by another module
    ("from time import clock_gettime as clock, CLOCK_REALTIME\nrows = [clock(CLOCK_REALTIME)]\n", ["rows"]),
    ("import numpy as np\nrows = [str(np.datetime64('now'))]\n", ["rows"]),  # the clock, by what it is given
    ("import pandas as pd\nWHEN = 'today'\ndef day():\n    return pd.Timestamp(WHEN).day\nrows = [day()]\n", ["rows"]),
    # rank-0 work (a save) that gives back what training reads: rank 0 saves, every rank gets the value
    ("import numpy as np, pathlib as pl\ndef cache(name):\n    p = pl.Path(name) / 'f.npy'\n    np.save(p, [1])\n"
     "    return p\nrows = cache('c')\n", ["rows"]),
    ("from numpy import save as keep\ndef store(batch):\n    keep('b.npy', batch)\n    return 'b.npy'\n"
     "rows = [store(b) for b in range(2)]\n", ["rows"]),
    # a field's default factory that reads the clock or draws a uuid: made as the notebook's class is
    ("import datetime as dtm\nfrom dataclasses import dataclass, field\n@dataclass\nclass Cfg:\n    lr: float = 0.1\n"
     "    out: str = field(default_factory=lambda: f'runs/{dtm.datetime.now():%H%M%S}')\nrows = Cfg()\n", ["rows"]),
    ("import uuid, dataclasses as dc\n@dc.dataclass\nclass Run:\n    tag: str = dc.field(default_factory=uuid.uuid4)\n"
     "rows = [Run()]\n", ["rows"]),
    ("import time\nfrom dataclasses import dataclass, field\ndef stamp():\n    return str(time.time_ns())\n"
     "@dataclass\nclass Run:\n    tag: str = field(default_factory=stamp)\nrows = Run()\n", ["rows"]),
])
def test_values_training_needs_that_each_rank_would_compute_alone_are_rank_0s_given_to_every_rank(cell, names):
    (out, train), report = convert(cell, GIVE_TRAIN)
    given = 'nbddp_share_values(globals(), ' + ", ".join(f'"{n}"' for n in names) + ')\n'
    assert given in out and "if NBDDP_IS_MAIN:\n" in out, out
    assert train == GIVE_TRAIN
    assert f"every rank gets rank 0's {', '.join(names)}" in report.format()


@pytest.mark.parametrize("cell, call", [
    ("import random, time\nrandom.seed(time.time())\n", "time.time"),
    ("import time\nfrom trl import SFTConfig\ndef make_args():\n    return SFTConfig(output_dir=f'out/{time.time_ns()}')\n"
     "args = make_args()\n", "make_args"),  # a trainer's configuration holds the process's state: never rank 0's
    ("import uuid\nfrom transformers import TrainingArguments as TA\nargs = TA(output_dir='o/' + uuid.uuid4().hex)\n",
     "uuid.uuid4"),
    # computed when a class or function is defined: a class attribute, a field's default, a parameter's default
    ("from datetime import datetime as DT\nclass Cfg:\n    out = DT.now().strftime('%H%M%S')\nfrom trl import SFTConfig\n"
     "args = SFTConfig(output_dir=Cfg.out)\n", "DT.now"),
    ("import time\nfrom dataclasses import dataclass\n@dataclass\nclass Run:\n    out: str = f'o-{time.time()}'\n"
     "from trl import SFTConfig\nargs = SFTConfig(output_dir=Run().out)\n", "time.time"),
    ("import uuid\nfrom trl import SFTConfig\ndef make(tag=uuid.uuid4().hex):\n    return SFTConfig(output_dir=tag)\n"
     "args = make()\n", "uuid.uuid4"),
])
def test_a_value_of_its_own_that_training_needs_but_no_name_holds_is_reported(cell, call):
    (out, _), report = convert(cell, GIVE_TRAIN.replace("rows)", "rows, args=args)") if "args" in cell else GIVE_TRAIN)
    assert "NBDDP_IS_MAIN" not in out and "nbddp_share_values" not in out, out
    assert f"`{call}()` gives each rank a value of its own" in report.format()


def test_a_value_of_its_own_from_a_module_of_the_notebooks_own_is_rank_0s():
    (_, out, train), report = convert("%%writefile naming.py\nimport uuid\ndef run_id():\n    return uuid.uuid4().hex\n",
                                      "import naming\nrows = [naming.run_id()]\n", GIVE_TRAIN)
    assert 'nbddp_share_values(globals(), "rows")\n' in out and train == GIVE_TRAIN, out


@pytest.mark.parametrize("bound", ["import importlib\nnet = importlib.import_module('requests')\n",
                                   "net = __import__('requests')\n", "from importlib import import_module as im\n"
                                   "net = im('requests')\n"])
def test_a_module_bound_by_a_call_is_an_import(bound):
    """`net = importlib.import_module("requests")`: `net.post(...)` is requests' post, once, at the top level and in
    the loop that trains (before, the top-level post ran on every rank, as if it changed `net`)."""
    loop = ("import torch\nfor i in range(2):\n    loss = torch.ones(1, requires_grad=True).sum()\n    loss.backward()\n"
            "    net.post('https://hook', json={'i': i})\n")
    out, _ = convert(bound + "reply = net.post('https://hook', json={})\n", loop)
    assert "if NBDDP_IS_MAIN:\n    reply = net.post('https://hook', json={})" in out[0], out
    assert "    if NBDDP_IS_MAIN:\n        net.post('https://hook', json={'i': i})" in out[1], out


@pytest.mark.parametrize("cell, line", [
    ("from accelerate import Accelerator\nfrom accelerate.utils import broadcast_object_list\nacc = Accelerator()\n"
     "obj = [None]\nif acc.is_main_process:\n    obj = ['best']\nbroadcast_object_list(obj)\n", "broadcast_object_list(obj)"),
    ("import torch.distributed as dist\nbox = [None]\nif dist.get_rank() == 0:\n    box = [42]\n"
     "dist.broadcast_object_list(box, src=0)\n", "dist.broadcast_object_list(box, src=0)"),
    ("import torch, torch.distributed as D\nt = torch.zeros(1)\nif D.get_rank() == 0:\n    t = torch.ones(1)\n"
     "send = D.broadcast\nsend(t, 0)\n", "send(t, 0)"),
])
def test_rank_0s_value_given_to_a_collective_is_every_ranks_after_it(cell, line):
    """The notebook's own broadcast stays on every rank, with no warning that it reads what only rank 0 computed."""
    (out, train), report = convert(cell + "print(len(" + line.split("(")[1].split(",")[0].rstrip(")") + "))\n", TRAIN)
    assert "\n" + line + "\n" in out and "only rank 0 computed" not in report.format(), (out, report.format())


@pytest.mark.parametrize("cell, call", [
    ("import time\nstart = time.time()\nfor x in loader:\n    loss = model(x).sum()\n    loss.backward()\n    opt.step()\n"
     "    if time.time() - start > 30:\n        break\n", "time.time"),
    ("from time import monotonic as now\ndef fit(limit):\n    end = now() + limit\n    while now() < end:\n"
     "        model(batch).sum().backward()\n        opt.step()\nfit(60)\n", "now"),
    ("import time\nfrom transformers import Trainer, TrainerCallback\nclass Limit(TrainerCallback):\n"
     "    def __init__(self, s):\n        self.deadline = time.time() + s\n"
     "    def on_step_end(self, args, state, control, **kw):\n        if time.time() > self.deadline:\n"
     "            control.should_training_stop = True\n"
     "trainer = Trainer(model=model, train_dataset=ds, callbacks=[Limit(60)])\nstats = trainer.train()\n", "time.time"),
])
def test_a_stop_each_rank_decides_by_its_own_clock_is_reported(cell, call):
    """Ranks may stop at different steps, and one then waits for the others at its next collective."""
    _, report = convert(cell)
    assert f"`{call}()` decides when training stops, and each rank reads its own" in report.format(), report.format()


def test_a_clock_read_in_training_that_stops_nothing_is_not_reported():
    _, report = convert("import time\nlast = time.time()\nfor x in loader:\n    model(x).sum().backward()\n"
                        "    opt.step()\n    if time.time() - last > 60:\n        print('still training')\n"
                        "        last = time.time()\n")
    assert "decides when training stops" not in report.format()


def test_a_clock_read_training_does_not_need_is_left_to_rank_0():
    (out, _), report = convert("import time\nstart = time.time()\nprint('started', start)\n", GIVE_TRAIN)
    assert "nbddp_share_values" not in out and "gives each rank" not in report.format()


def test_set_up_of_a_library_training_comes_from_says_why_it_runs_on_every_rank():
    _, report = convert("from unsloth import PatchFastRL, UnslothTrainer\nPatchFastRL('GRPO', None)\n" + "x = 1\n",
                        "trainer = UnslothTrainer(model=model)\nstats = trainer.train()\n")
    assert "cell 1, line 2: runs on every rank: it calls unsloth for its effect, a library training's own objects " \
           "come from" in report.format()  # the cell and the line where nbddp chose


@pytest.mark.parametrize("hook", [
    "        requests.post(URL, json=logs)\n",
    "        if logs:\n            hooks.send(URL, text=str(logs))\n",
    "        for key in logs:\n            requests.post(URL, json={key: logs[key]})\n",
])
def test_an_effect_in_a_training_callbacks_hook_runs_on_rank_0(hook, more=""):
    head = "import requests\nimport slackhooks as hooks\nfrom transformers import TrainerCallback\nURL = 'https://x'\n"
    head += more
    cls = "class Notify(TrainerCallback):\n    def on_log(self, args, state, control, logs=None, **kw):\n" + hook + \
          "        control.should_log = True\n"
    out, report = convert(head + cls + "x = 1\n", TRAIN.replace("train_dataset=ds", "train_dataset=ds, "
                                                                 "callbacks=[Notify()]"))
    assert "if NBDDP_IS_MAIN:\n" in out[0] and "nbddp_barrier" not in out[0].split("class Notify")[1], out[0]
    assert "        control.should_log = True\n" in out[0]  # what the hook decides: on every rank
    assert "in the callback's Notify hooks" in report.format()


@pytest.mark.parametrize("hook", [
    "        threading.Thread(target=requests.post, args=(URL,), kwargs={'json': logs}).start()\n",
    "        POOL.submit(hooks.send, URL, text=str(logs))\n",
    "        th.Thread(target=note, args=(logs,), daemon=True).start()\n",  # the notebook's function, which posts
])
def test_an_effect_handed_to_a_thread_or_pool_in_a_callbacks_hook_runs_on_rank_0(hook):
    pool = "import threading, threading as th\nfrom concurrent.futures import ThreadPoolExecutor\nPOOL = " \
           "ThreadPoolExecutor(2)\ndef note(x):\n    requests.post(URL, json=x)\n"
    test_an_effect_in_a_training_callbacks_hook_runs_on_rank_0(hook, pool)


def test_a_list_the_notebook_hands_its_function_to_is_changed_by_it():
    """`HOOKS.append(note)`: a list's method given a function keeps it (no library runs it): the trainer reads HOOKS."""
    out, _ = convert("import requests\ndef note(x):\n    requests.post('u', json=x)\nHOOKS = []\n", "HOOKS.append(note)\n",
                     "from trl import SFTTrainer\ntrainer = SFTTrainer(model=model, train_dataset=ds, callbacks=HOOKS)\n"
                     "trainer.train()\n")
    assert out[1] == "nbddp_show(HOOKS.append(note))\n", out


@pytest.mark.parametrize("hook", [
    "        threading.Thread(target=time.sleep, args=(0.1,)).start()\n",  # Python's own call: every rank's
    "        threading.Thread(target=keep, args=(logs,)).start()\n",  # fills the notebook's list
])
def test_pythons_own_work_handed_to_a_thread_in_a_hook_stays_on_every_rank(hook):
    head = "import threading, time\nfrom transformers import TrainerCallback\nSEEN = []\ndef keep(x):\n" \
           "    SEEN.append(x)\n"
    cls = "class Notify(TrainerCallback):\n    def on_log(self, args, state, control, logs=None, **kw):\n" + hook
    out, _ = convert(head + cls, TRAIN.replace("train_dataset=ds", "train_dataset=ds, callbacks=[Notify()]"))
    assert "NBDDP_IS_MAIN" not in out[0].split("class Notify")[1], out[0]


@pytest.mark.parametrize("hook", [
    "        getattr(requests, self.verb)(URL, json=logs)\n",  # a verb the callback holds: some call of requests
    "        send = getattr(hooks, 'send')\n        send(URL, text=str(logs))\n",
])
def test_an_effect_through_getattr_in_a_callbacks_hook_runs_on_rank_0(hook):
    test_an_effect_in_a_training_callbacks_hook_runs_on_rank_0(hook)


LOOP = ("import torch\nmodel = torch.nn.Linear(4, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "X = torch.randn(8, 4)\n")
STEP = "    loss = model(X).pow(2).mean()\n    loss.backward(); opt.step(); opt.zero_grad()\n"


@pytest.mark.parametrize("cells, effect", [
    # a decorator of the notebook's around the training step
    (["import requests, functools\ndef notify(fn):\n    @functools.wraps(fn)\n    def wrapper(*a, **k):\n"
      "        out = fn(*a, **k)\n        requests.post('https://x', data=str(out))\n        return out\n    return wrapper\n",
      LOOP + "@notify\ndef train_step(i):\n" + STEP + "    return i\n", "for i in range(3):\n    train_step(i)\n"],
     "requests.post('https://x', data=str(out))"),
    # a context manager of the notebook's around training, through an alias
    (["import urllib.request as ur, contextlib\n@contextlib.contextmanager\ndef announced(name):\n"
      "    ur.urlopen(f'https://x/start/{name}')\n    yield\n", LOOP + "with announced('t'):\n    for i in range(3):\n" +
      STEP.replace("    ", "        ")], "ur.urlopen(f'https://x/start/{name}')"),
    # a seeding function that also posts, called through another function
    (["import random, requests as http\ndef seed_all(s):\n    random.seed(s)\n    http.post('https://x', json={'s': s})\n"
      "def setup():\n    seed_all(42)\n", "setup()\n", LOOP + "for i in range(3):\n" + STEP],
     "http.post('https://x', json={'s': s})"),
    # a datagram of Python's own socket module, from a function the loop calls
    (["import socket as so\ndef ping(step):\n    so.socket(so.AF_INET, so.SOCK_DGRAM).sendto(str(step).encode(), "
      "('10.0.0.1', 8125))\n", LOOP + "for i in range(3):\n" + STEP + "    ping(i)\n"],
     "so.socket(so.AF_INET, so.SOCK_DGRAM).sendto("),
    # a program started at each step (nbddp.entries.STARTS_PROGRAMS), from a function the loop calls
    (["import subprocess as sp\ndef gpu_log():\n    sp.run(['nvidia-smi', '--query-gpu=memory.used', '--format=csv'])\n",
      LOOP + "for i in range(3):\n" + STEP + "    gpu_log()\n"], "sp.run(['nvidia-smi'"),
])
def test_an_effect_in_a_function_that_every_rank_runs_runs_on_rank_0(cells, effect):
    out, report = convert(*cells, "print('done')\n")
    script = "".join(out)
    assert "if NBDDP_IS_MAIN:\n" in script and effect in script, script
    line = next(line for line in script.splitlines() if effect in line)
    above = script.splitlines()[script.splitlines().index(line) - 1]
    assert above.strip() == "if NBDDP_IS_MAIN:" and len(line) - len(line.lstrip()) > len(above) - len(above.lstrip())
    assert "nbddp_barrier" not in script.split("nbddp_rest_on_rank0()")[0], script  # no wait for an effect


def test_an_effect_in_a_lightning_modules_hook_runs_on_rank_0_and_pythons_own_calls_stay():
    cell = ("import requests, time\nimport lightning as L\nclass Module(L.LightningModule):\n"
            "    def training_step(self, batch, i):\n        return self.model(batch).loss\n"
            "    def on_train_epoch_end(self):\n        time.sleep(0)\n        requests.post('https://x', json={})\n")
    out, report = convert(cell, "trainer = L.Trainer(max_epochs=1)\ntrainer.fit(Module(), dl)\n")
    assert "        time.sleep(0)\n        if NBDDP_IS_MAIN:\n            requests.post('https://x', json={})\n" in out[0]
    assert "return self.model(batch).loss\n" in out[0] and "post() in the callback's Module hooks" in report.format()


@pytest.mark.parametrize("cells", [
    ["import gradio as gr\ndemo = gr.Interface(fn=str, inputs='text', outputs='text')\n", "demo.launch(share=False)\n"],
    ["import gradio\nwith gradio.Blocks() as app:\n    box = gradio.Textbox()\n", "app.launch()\n"],
    ["from gradio import ChatInterface\ndef serve(chat):\n    chat.launch(server_port=7860)\n",
     "serve(ChatInterface(fn=str))\n"],
])
def test_a_demo_launch_returns_as_in_a_notebook(cells):
    out, report = convert(*cells)
    assert "prevent_thread_lock=True" in "".join(out) or "prevent_thread_lock = True" in "".join(out), out
    assert "the demo runs until the script ends, then stops with it" in report.format()


@pytest.mark.parametrize("cells", [
    ["from sklearn.linear_model import LogisticRegression\ndef fit_probe(est, X, y):\n    est.fit(X, y)\n",
     "fit_probe(LogisticRegression(), X, y)\n"],
    ["import sklearn.cluster as sc\nclass Probe:\n    def run(self, model):\n        model.fit(X)\n",
     "Probe().run(model=sc.KMeans(3))\n"],
    ["def start(server):\n    server.launch()\n", "import gradio as gr\nimport subprocess as sp\n", "start(sp.Popen(['true']))\n"],
])
def test_a_parameter_is_what_the_notebooks_calls_give_it_not_its_methods_name(cells):
    """`est.fit(...)` on a parameter that every call gives a scikit-learn estimator is no training, and `s.launch()`
    of a value that is no demo server gets no demo's keyword: the parameter is followed to the calls."""
    out, _ = convert(TRAIN, *cells)
    assert out[0].endswith(REST), out
    assert "prevent_thread_lock" not in "".join(out), out


@pytest.mark.parametrize("cells", [
    ["from trl import SFTTrainer\ndef run(t):\n    t.train()\n", "tr = SFTTrainer(model=model)\n", "run(tr)\n"],
    ["import transformers as tf\ndef go(*, runner):\n    return runner.train()\n",
     "stats = go(runner=tf.Trainer(model=model))\n"],
    ["from trl import SFTTrainer as S\nclass Job:\n    def __init__(self, trainer):\n        self.stats = None\n"
     "    def start(self, trainer):\n        trainer.train()\n", "job = Job(None)\n", "job.start(S(model=model))\n"],
])
def test_training_through_a_parameter_ends_where_the_call_gives_it_a_trainer(cells):
    out, _ = convert(*cells, "print('done')\n")
    assert out[-2].endswith(REST) and REST not in "".join(out[:-2]), out


def test_what_a_parameter_is_given_is_its_meaning():
    from nbddp.meanings import Names
    import libcst as cst

    module = cst.parse_module("from trl import SFTTrainer\nimport sklearn.svm as svm\n"
                              "def f(a, b=svm.SVC(), *args, c=None):\n    return a, b, c\n"
                              "f(SFTTrainer(), c=1)\nf(*xs)\n")
    names = Names(module)
    params = {p.name.value: p for p in module.body[2].params.params + module.body[2].params.kwonly_params}
    assert names.meanings(module.body[2].body.body[0].body[0].value.elements[0].value) == {"trl.SFTTrainer()"}
    assert names.meanings(module.body[2].body.body[0].body[0].value.elements[1].value) == {"sklearn.svm.SVC()"}
    assert [type(arg).__name__ for arg in names.passed(params["c"])] == ["Name", "Integer"]


@pytest.mark.parametrize("cell, names, libraries", [
    ("import requests\nmeta = requests.get('http://x/meta').json()\n", "meta", "requests"),
    ("import mylib as ml\ndef fetch():\n    return ml.fetch_rows('x')\nrows = fetch()\n", "rows", "mylib"),
    ("import mylib\nrows = []\nfor part in range(2):\n    rows += mylib.fetch_rows(part)\n", "rows", "mylib"),
])
def test_a_value_training_needs_from_another_library_is_reported_as_every_ranks(cell, names, libraries):
    """Where nbddp chose between two readings (training needs the value; the call is of a library training's objects
    do not come from), the report says which way it went and why."""
    out, report = convert(cell, "from trl import SFTTrainer\ntrainer = SFTTrainer(model=model, train_dataset=rows, "
                                "args=meta)\ntrainer.train()\n")
    assert "NBDDP_IS_MAIN" not in out[0]
    line = {"meta": 2, "rows": 4}[names] - ("for part" in cell)  # the line that makes (or fills) the value
    assert f"cell 1, line {line}: runs on every rank: training reads {names}, made by calls of {libraries}, which " \
           "training's own objects do not come from" in report.format()


@pytest.mark.parametrize("cells", [
    ["import dsreg as dr\ndr.register_dataset('mine', path='d.jsonl')\n", "rows = dr.load('mine')\n"],  # an alias
    ["from dsreg import register\nimport dsreg\ndef setup():\n    register('mine')\n", "setup()\n",
     "rows = dsreg.load('mine')\n"],                                             # in a function, over cells
    ["import mylib\nfor name in ['a', 'b']:\n    mylib.add_source(name)\nrows = mylib.collect()\n"],  # in a loop
])
def test_set_up_of_a_library_whose_values_training_reads_runs_on_every_rank(cells):
    """`mylib.register(...)` before `rows = mylib.load(...)`, which training reads: the load runs on every rank, and
    so does what set that library's state before it (before, rank 0 alone registered, and rank 1's load failed)."""
    out, report = convert(*cells, "from trl import SFTTrainer\ntrainer = SFTTrainer(model=model, train_dataset=rows)\n"
                                  "trainer.train()\n")
    assert "NBDDP_IS_MAIN" not in "".join(out[:-1]), out
    said = report.format()
    assert "the first rank of each machine first: it calls" in said, said
    assert "for its effect, a library whose calls make values training reads" in said, said
    assert "with nbddp_main_process_first():" in "".join(out), out  # a download or a registry: once per machine first


@pytest.mark.parametrize("cells, once", [
    (["import sidefx as sx\nsx.announce('start')\npager = sx.Pager()\n"], "sx.announce('start')"),  # an alias
    (["import sidefx\n", "sidefx.announce('start')\n", "from sidefx import Pager\npager = Pager()\n"],
     "sidefx.announce('start')"),                                                 # over cells
])
def test_a_client_training_only_calls_methods_of_makes_no_set_up_of_its_library(cells, once):
    """Training reads `pager` only to call its methods (a client that sends): its library's calls before it stay
    effects, once (the 2-rank e2e_once notebook's pager)."""
    out, _ = convert(*cells, "from trl import SFTTrainer\ndef fit():\n    pager.send('fit')\n"
                             "    return SFTTrainer(model=model, train_dataset=ds).train()\nstats = fit()\n")
    assert f"if NBDDP_IS_MAIN:\n    nbddp_show({once})" in "".join(out) or f"if NBDDP_IS_MAIN:\n    {once}" in \
        "".join(out), out
    assert "with nbddp_main_process_first()" not in "".join(out), out


@pytest.mark.parametrize("cells", [
    ["import dsreg\ndsreg.register('mine', [1.0])\n", "rows = dsreg.load('mine')\nprint(sum(rows))\n"],
    ["import nltk as nl\ndef prepare():\n    nl.download('punkt')\nprepare()\n", "words = nl.word_tokenize('a b')\n"],
    ["import mylib\nfor name in ['a', 'b']:\n    mylib.add_source(name)\n", "rows = mylib.collect()\n"],
])
def test_without_training_set_up_of_a_library_whose_values_a_later_line_makes_runs_on_every_rank(cells):
    """No training's end: `dsreg.register(...)` only calls another library for its effect, but a later line makes a
    value of that library on every rank: the registration (a download) runs on every rank, the first of each machine
    first (before, rank 0 alone registered and rank 1's load failed)."""
    out, report = convert(*cells)
    assert "NBDDP_IS_MAIN" not in out[0] and "with nbddp_main_process_first():" in out[0], out[0]
    assert "a library whose calls make values every rank reads" in report.format()


@pytest.mark.parametrize("cell, once", [
    ("import dsreg, notify\nnotify.send('start')\nrows = dsreg.load('mine')\n", "notify.send('start')"),  # another
    ("import requests\nrequests.post('http://hook', json={})\nrows = requests.get('http://x').json()\n",  # one that
     "requests.post('http://hook', json={})"),                                   # sends: its value read, not its set-up
    # a library nbddp never mentions, given a web address (through a name, an f-string), in a function
    ("import niquests as nq\nHOOK = 'https://hooks/x'\nnq.post(HOOK, json={})\nrows = nq.get('https://x').json()\n",
     "nq.post(HOOK, json={})"),
    ("import pycurlish as pc\ndef ping(n):\n    pc.send(f'https://hooks/{n}')\nping(1)\nrows = pc.fetch('data')\n",
     "ping(1)"),
    ("import notify, dsreg\ndef ping(n):\n    notify.send(n)\nping(1)\nrows = dsreg.load('mine')\n", "ping(1)"),  # its
])                                                                                # body as it was, converted again
def test_a_call_of_another_library_or_of_one_that_sends_before_such_a_load_still_runs_once(cell, once):
    out, _ = convert(cell, "from trl import SFTTrainer\ntrainer = SFTTrainer(model=model, train_dataset=rows)\n"
                           "trainer.train()\n")
    assert f"if NBDDP_IS_MAIN:\n    {once}" in out[0], out[0]


SAME = 'nbddp_same_values(globals(), "run")\n'
USES_RUN = "from trl import SFTConfig\nargs = SFTConfig(output_dir=run)\n" + TRAIN.replace("ds)", "ds, args=args)")


@pytest.mark.parametrize("cell", [
    "import namer\nrun = 'runs/' + namer.slug()\n",                              # a module function
    "from namer import slug as make\nrun: str = f'runs/{make()}'\n",             # an alias, annotated
    "import namer\ndef name_it():\n    return namer.Namer().next()\nrun = name_it()\n",  # in a function
])
def test_a_plain_value_training_reads_from_another_library_is_rank_0s_on_every_rank(cell):
    """A value training reads that every rank makes with a library nbddp has no entries for (a run name, an id) may
    differ by rank: after the line, every rank takes rank 0's where it is plain (nbddp_same_values, at run time)."""
    out, report = convert(cell, USES_RUN)
    assert out[0] == cell + SAME, out[0]
    assert "every rank takes rank 0's" in report.format()


@pytest.mark.parametrize("cell", [
    "import namer\nrun = namer.Namer()\nrun.reset()\n",            # an object: the notebook reads its attributes
    "import namer\nrun = 'runs'\nnamer.decorate(run)\n",           # a literal (the call reads it: rank 0's)
    "import numpy as np\nrun = str(np.random.randint(9))\n",        # a computing library (the same random state)
])
def test_other_values_training_reads_are_left_as_they_are(cell):
    out, _ = convert(cell, USES_RUN)
    assert "nbddp_same_values" not in out[0], out[0]


@pytest.mark.parametrize("cells, name", [
    (["import wandb\nrun_id = wandb.util.generate_id()\n"], "run_id"),
    (["import mlflow as mf\nexp = mf.set_experiment('x')\n"], "exp"),
    (["from wandb.util import generate_id as gid\ndef new_id():\n    return 'run-' + gid()\nrun_id = new_id()\n"], "run_id"),
    (["import wandb\nwandb.init(project='x')\nrun_id = wandb.run.name\n"], "run_id"),  # the state a tracker keeps
    (["import wandb as wb\nrun = wb.init(project='x')\n", "run_id = run.id\n"], "run_id"),  # over cells
])
def test_a_trackers_value_training_reads_is_rank_0s_given_to_every_rank(cells, name):
    """A tracker's call is rank-0 work, and so is reading what its run keeps; where training reads what they give (a
    run id in the trainer's config), rank 0 runs the line and every rank gets the value. Before, the config was
    guarded to rank 0 too and the trainer on rank 1 read a name it never had (or `wandb.run` was None there)."""
    out, report = convert(*cells, f"from trl import SFTConfig\nargs = SFTConfig(output_dir=str({name}))\n" +
                          TRAIN.replace("ds)", "ds, args=args)"))
    assert out[-2].endswith(f'nbddp_share_values(globals(), "{name}")\n'), out[-2]
    assert "NBDDP_IS_MAIN" not in out[-1], out[-1]
    assert f"every rank gets rank 0's {name}" in report.format()


@pytest.mark.parametrize("cell", [
    "import ignite.distributed as idist\nlog = f'log_{idist.get_rank()}.txt'\nopen(log, 'w').write('x')\n",
    "from deepspeed import comm as dc\nif dc.get_rank() == 1:\n    open('one.txt', 'w').write('x')\n",
    "import horovod.torch as hvd\ndef mine():\n    return hvd.local_rank()\nwith open(f'r{mine()}.json', 'w') as fh:\n"
    "    fh.write('x')\n",
])
def test_the_rank_read_through_another_distributed_library_is_each_ranks(cell):
    """deepspeed's, ignite's and horovod's readers of the group's rank are read as torch.distributed's: the line is
    the notebook's own per-rank code (every rank, after training too), never rank 0's value given to the others."""
    out, _ = convert(TRAIN, cell)
    assert "NBDDP_IS_MAIN" not in out[1] and "nbddp_same_values" not in out[1], out[1]
    assert REST not in out[0], out[0]  # training's end moves to the line that reads the rank: every rank runs it


def test_values_of_the_standard_library_or_trainings_libraries_are_not_reported_so():
    _, report = convert("import json, datasets\nmeta = json.load(open('m.json'))\nrows = datasets.load_dataset('x')\n",
                        "from trl import SFTTrainer\ntrainer = SFTTrainer(model=model, train_dataset=rows, args=meta)\n"
                        "trainer.train()\n")
    assert "which training's own objects do not come from" not in report.format()


@pytest.mark.parametrize("cells", [
    ["DATA = None\ndef refresh():\n    global DATA\n    DATA = load_rows()\n", "refresh()\n"],
    ["DATA = None\ndef fill():\n    global DATA\n    DATA = load_rows()\ndef refresh():\n    fill()\n", "refresh()\n"],
    ["def refresh(n):\n    global DATA, EXTRA\n    for _ in range(n):\n        DATA = load_rows()\n", "refresh(2)\n"],
])
def test_a_global_the_notebooks_function_sets_that_training_reads_is_set_on_every_rank(cells):
    train = "from trl import SFTTrainer\ntrainer = SFTTrainer(model=model, train_dataset=DATA)\ntrainer.train()\n"
    out, report = convert(*cells, train)
    assert out[-2] == cells[-1] and "NBDDP_IS_MAIN" not in "".join(out), out


@pytest.mark.parametrize("cell", [
    "import torch.distributed as dist\nif dist.get_rank() == 1:\n    with open('two.txt', 'w') as fh:\n        fh.write('x')\n",
    "import os\ndef rank():\n    return int(os.environ['RANK'])\nfor r in range(2):\n    if rank() == r:\n"
    "        model.save_pretrained(f'out-{r}')\n",
    "import json\nif trainer.args.process_index != 0: json.dump({}, open('other.json', 'w'))\n",
    # a name or attribute spelled like a main-process flag that holds another rank's test: read by its value
    "import torch.distributed as dist\nis_main_process = dist.get_rank() == 1\nif is_main_process:\n"
    "    open('two.txt', 'w').write('x')\n",
    "import torch.distributed as dist\nclass Cfg:\n    should_save = True\ncfg = Cfg()\n"
    "if cfg.should_save and dist.get_rank() == 1:\n    open('two.txt', 'w').write('x')\n",
    # a log record (a handler may send it away: rank 1's record, as written)
    "import logging, os\nlog = logging.getLogger('x')\nif int(os.environ['RANK']) == 1:\n    log.warning('one')\n",
    "from logging import warning as say\nimport torch.distributed as dist\ndef report():\n"
    "    if dist.get_rank() > 0:\n        say('other rank')\nreport()\n",
    # a database of its own (the runtime gives other ranks their own copy of the notebook's databases)
    "import sqlite3, torch.distributed as dist\nif dist.get_rank() == 1:\n    db = sqlite3.connect('one.db')\n"
    "    db.commit()\n",
    # the `else` of a test only rank 0 passes: the other ranks' branch
    "import os\nif int(os.environ.get('LOCAL_RANK', 0)) == 0:\n    print('main')\nelse:\n"
    "    open('other.txt', 'w').write('x')\n",
    "def ours():\n    return trainer.is_world_process_zero()\nif ours():\n    pass\nelse: open('n.txt', 'w').write('x')\n",
    "from accelerate import Accelerator as A\nacc = A()\nfor part in ('a', 'b'):\n    if acc.is_main_process:\n"
    "        continue\n    else:\n        open('parts.txt', 'a').write(part)\n",
    # what follows a test that leaves its block: the ranks it lets through (a function's early return, a loop's skip)
    "import torch.distributed as dist\ndef finish():\n    if dist.get_rank() != 1:\n        return\n"
    "    open('b.json', 'w').write('x')\nfinish()\n",
    "from torch.distributed import get_rank as who\nfor part in ('a', 'b'):\n    if who() == 0:\n        continue\n"
    "    model.save_pretrained(part)\n",
    "import os\ndef others():\n    if int(os.environ['RANK']) == 0:\n        print('skip')\n        return\n"
    "    open('o.txt', 'w').write('x')\nothers()\n",
    # a function a decorator runs on the processes it picks (accelerate's, of an Accelerator or a PartialState)
    "from accelerate import Accelerator\nacc = Accelerator()\n@acc.on_process(process_index=1)\ndef second():\n"
    "    open('s.txt', 'w').write('x')\nsecond()\n",
    "import accelerate\nstate = accelerate.PartialState()\n@state.on_last_process\ndef last():\n"
    "    model.save_pretrained('last')\nlast()\n",
    # a decorator of the notebook's own whose wrapper tests the rank
    "import torch.distributed as dist\ndef on_rank(r):\n    def deco(f):\n        def wrapped():\n"
    "            if dist.get_rank() == r:\n                return f()\n        return wrapped\n    return deco\n"
    "@on_rank(1)\ndef one():\n    open('one.txt', 'w').write('x')\none()\n",
])
def test_what_the_notebooks_own_rank_test_writes_is_written_by_the_ranks_it_picks(cell):
    out, report = convert(TRAIN, cell)
    assert "with nbddp_rank_block():\n" in out[1] and "nbddp_rank_block" in report.format(), out[1]
    assert convert(*out)[0] == out  # converting converted code changes nothing more


@pytest.mark.parametrize("cell", [
    "import torch.distributed as dist\nif dist.get_rank() == 1:\n    print('one')\n",  # writes nothing
    "if NBDDP_IS_MAIN:\n    model.save_pretrained('out')\n",  # nbddp's own guard
    "import logging, torch.distributed as dist\nif dist.get_rank() == 0:\n    logging.warning('zero')\n",  # rank 0's
    "rank = 16\nif rank > 8:\n    open('x.txt', 'w').write('x')\n",  # a LoRA rank is a number
    "import torch.distributed as dist\nif dist.get_rank() != 0:\n    pass\nelse:\n    open('z.txt', 'w').write('x')\n",
    "import torch.distributed as dist\ndef zero():\n    if dist.get_rank() != 0:\n        return\n"
    "    open('z.txt', 'w').write('x')\nzero()\n",  # what follows is rank 0's: the nets write it anyway
    "from accelerate import Accelerator\nacc = Accelerator()\n@acc.on_main_process\ndef main():\n"
    "    open('m.txt', 'w').write('x')\nmain()\n",  # the main process alone
])
def test_other_tests_and_blocks_that_write_nothing_are_left_as_they_are(cell):
    out, _ = convert(TRAIN, cell)
    assert "nbddp_rank_block" not in out[1], out[1]


@pytest.mark.parametrize("cells", [
    ["import functools, threading\ncache = {}\ndef fill(store, key):\n    store[key] = load_rows(key)\n",
     "jobs = [functools.partial(fill, cache, k) for k in ('train', 'extra')]\n"
     "threads = [threading.Thread(target=j) for j in jobs]\nfor t in threads: t.start()\nfor t in threads: t.join()\n"],
    ["from functools import partial as later\ncache = {}\ndef fill(store, key):\n    store[key] = load_rows(key)\n",
     "steps = [later(fill, cache, 'train')]\n", "for step in steps:\n    step()\n"],
    ["from concurrent.futures import ThreadPoolExecutor\ncache = {}\ndef fill(store, key):\n    store[key] = load_rows(key)\n",
     "with ThreadPoolExecutor(2) as pool:\n    futures = [pool.submit(fill, cache, k) for k in ('train', 'extra')]\n"],
    ["import threading\ncache = {}\ndef fill(store, key):\n    store[key] = load_rows(key)\n",
     "threads = [threading.Thread(target=fill, args=(cache, k)) for k in ('train', 'extra')]\n",
     "for t in threads: t.start()\nfor t in threads: t.join()\n"],
    ["from concurrent.futures import ThreadPoolExecutor as TPE\ncache = {}\ndef fill(key):\n    cache[key] = load_rows(key)\n",
     "ex = TPE(2)\nresults = list(ex.map(fill, ['train', 'extra']))\n"],
    ["from functools import partial\nfrom multiprocessing.pool import ThreadPool\ncache = {}\n"
     "def fill(store, key):\n    store[key] = load_rows(key)\n", "done = ThreadPool(2).map(partial(fill, cache), ['train'])\n"],
    ["cache = {}\ndef fill(key):\n    cache[key] = load_rows(key)\n", "for _ in map(fill, ['train']): pass\n"],
    ["cache = {}\ndef fill(store, key):\n    store[key] = load_rows(key)\n    return len(store)\n",
     "sizes = [fill(cache, k) for k in ('train', 'extra')]\n"],
    ["from concurrent.futures import ThreadPoolExecutor\ncache = {}\nfill = lambda store, key: store.update({key: 1})\n",
     "with ThreadPoolExecutor(2) as pool:\n    pool.submit(fill, cache, 'train').result()\n"],
    ["cache = {}\nput = lambda store, key: store.setdefault(key, load_rows(key))\n", "rows = put(cache, 'train')\n"],
    ["cache = {}\n", "done = list(map(lambda k: cache.update({k: load_rows(k)}), ['train']))\n"],
    ["from joblib import Parallel, delayed\ncache = {}\ndef fill(store, k):\n    store[k] = load_rows(k)\n",
     "done = Parallel(n_jobs=2, prefer='threads')(delayed(fill)(cache, k) for k in ['train'])\n"],
])
def test_what_a_function_of_the_notebooks_fills_is_filled_on_every_rank_also_when_handed_to_a_pool_or_thread(cells):
    """(also a lambda's: what its body changes)"""
    train = "from trl import SFTTrainer\ntrainer = SFTTrainer(model=model, train_dataset=cache['train'])\ntrainer.train()\n"
    out, _ = convert(*cells, train)
    assert "NBDDP_IS_MAIN" not in "".join(out) and out[:-1] == cells[:len(out) - 1], out


def test_a_lambda_that_only_reads_what_it_is_given_changes_nothing():
    """`sorted(rows, key=lambda r: ...)` reads rows: the print that shows it stays rank-0 work."""
    out, _ = convert("rows = load_rows('train')\n", "print(sorted(rows, key=lambda r: len(r))[:2])\n",
                     "from trl import SFTTrainer\ntrainer = SFTTrainer(model=model, train_dataset=rows)\n"
                     "trainer.train()\n")
    assert "if NBDDP_IS_MAIN:\n    print(sorted(rows" in out[1], out


@pytest.mark.parametrize("head", ["import logging as lg\nclass Hook(lg.Handler):\n",
                                  "from logging import Handler\nclass Hook(Handler):\n"])
def test_a_logging_handler_of_the_notebooks_sends_from_rank_0_while_every_rank_logs(head):
    """logging calls the handler's emit on every rank that logs: its request goes out once (also when it formats the
    record through its own method)."""
    out, _ = convert("import requests, torch\n" + head + "    def emit(self, record):\n"
                     "        requests.post('http://h/log', data=self.format(record))\n",
                     "import logging\nlog = logging.getLogger('x')\nlog.addHandler(Hook())\n",
                     "model = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                     "for step in range(3):\n    model(torch.ones(1, 2)).sum().backward()\n    opt.step()\n"
                     "    log.warning('step %d', step)\n")
    assert "    def emit(self, record):\n        if NBDDP_IS_MAIN or nbddp_in_rank_block():\n            requests.post(" \
        in out[0], out[0]
    assert "NBDDP_IS_MAIN" not in out[2], out[2]  # the loop and its logging: every rank


@pytest.mark.parametrize("test", ["import torch.distributed as dist\nif dist.get_rank() == 1:\n",
                                  "import os\ndef me():\n    return int(os.environ['RANK'])\nif me() > 0:\n"])
def test_a_logging_handler_of_the_notebooks_sends_what_its_own_rank_test_logs_from_that_rank(test):
    """The handler's guard lets the rank the notebook's own test picks send what that test logs (the runtime's
    nbddp_rank_block), as the notebook wrote it; the test's body is the runtime's block."""
    handler = "import logging, requests\nclass Hook(logging.StreamHandler):\n    def emit(self, record):\n" \
              "        requests.post('http://h/log', data=record.getMessage())\nlog = logging.getLogger('x')\n" \
              "log.addHandler(Hook())\n"
    out, _ = convert(handler, TRAIN, test + "    log.warning('from another rank')\n")
    assert "        if NBDDP_IS_MAIN or nbddp_in_rank_block():\n            requests.post(" in out[0], out[0]
    assert "with nbddp_rank_block():\n        log.warning" in out[2], out[2]


def test_a_barrier_named_by_code_with_quotes_is_a_string_python_reads():
    """The barrier after rank-0 work is named by the call's code, quotes and all (`Parallel(prefer='threads')(...)`)."""
    out, _ = convert("from joblib import Parallel, delayed\nimport requests\n",
                     "Parallel(n_jobs=2, prefer='threads')(delayed(requests.get)(u) for u in ['http://h/a'])\n",
                     "from trl import SFTTrainer\ntrainer = SFTTrainer(model=model, train_dataset=ds)\ntrainer.train()\n")
    compile("".join(out), "train_ddp.py", "exec")
    assert 'nbddp_barrier("Parallel(n_jobs=2, prefer=\'threads\')")' in out[1], out[1]


PING = "import requests\nrequests.post('https://x/hook', json={'start': 1})\n"


@pytest.mark.parametrize("cells, every_rank", [
    (["%%writefile ping.py\n" + PING + "SENT = True\n", "%run ping.py\n"], False),   # an effect, a name nobody reads
    (["%%writefile ping.py\n" + PING, "%run -m ping\n"], False),                     # as a module
    (["%%writefile ping.py\n" + PING, "def prep():\n    %run ping\n    return 1\nprep()\n"], False),  # in a function
    (["%%writefile data.py\nrows = [1, 2]\n", "%run data.py\n", "ds = rows\n"], True),  # training reads its name
    (["%%writefile fetch.py\nimport json, urllib.request as u\njson.dump(u.urlopen('http://h/d').read().decode(), "
      "open('d.json', 'w'))\n", "%run fetch.py\n", "import json\nds = json.load(open('d.json'))\n"], False),  # a file
    # training reads: rank 0 downloads it once, the others wait for it
    (["%%writefile seed.py\nimport torch\ntorch.manual_seed(0)\n", "%run -e seed\n"], True),  # set-up of torch
    (["%run $script\n"], True),                                                          # a file the converter cannot tell
])
def test_a_file_the_notebook_runs_is_read_for_what_it_does(cells, every_rank):
    """`%run file.py` runs where what the file's code does says: its names training reads, or its set-up of the
    process, on every rank; an effect alone (a web call) once."""
    kept, out, report = _kept(cells + [TRAIN])
    ran = next(i for i, cell in enumerate(kept) if "nbddp_run_file(" in cell)
    assert ("NBDDP_IS_MAIN" not in kept[ran]) == every_rank, kept[ran]
    assert "NBDDP_IS_MAIN" not in kept[-1], kept[-1]
    assert ("nbddp cannot read the code" in report.format()) == ("$" in cells[-1]), report.format()


@pytest.mark.parametrize("cells, every_rank", [
    (["%%writefile utils.py\ndef make_rows():\n    return [1, 2]\n", "exec(open('utils.py').read())\n",
      "ds = make_rows()\n"], True),                                   # exec of a file: its names the notebook's
    (["%%writefile utils.py\n" + PING, "from pathlib import Path as P\nexec(P('utils.py').read_text())\n"],
     False),                                                           # through an alias, an effect alone
    (["%%writefile cfg.py\nROWS = [1, 2]\n", "import runpy\nns = runpy.run_path('cfg.py')\n",
      "ds = ns['ROWS']\n"], True),                                     # runpy: its names in what it returns
    (["%%writefile ping.py\n" + PING, "from runpy import run_module as run\nfor _ in range(1):\n"
      "    run('ping')\n"], False),                                   # in a loop, a module: an effect alone
    (["%%writefile prep.py\nimport torch\ntorch.manual_seed(0)\n", "import runpy\nrunpy.run_path('prep.py')\n"],
     True),                                                            # set-up of torch
    (["%%writefile utils.py\ndef make_rows():\n    return [1, 2]\n", "exec(open('utils.py').read(), globals())\n",
      "ds = make_rows()\n"], True),                                   # into the notebook's own namespace
    (["code = 'import mylib\\nmylib.go()'\nexec(code)\n"], True),    # code the converter cannot read
])
def test_a_call_that_runs_a_files_code_is_read_as_a_run_of_it(cells, every_rank):
    """`exec(open("utils.py").read())` is `%run -i utils.py`, `runpy.run_path("cfg.py")` is `%run cfg.py` whose
    names are in the dict it returns: the line runs where what the file's code does says. Before, each ran on rank 0
    alone where training read no name the line bound (rank 1 had no `make_rows`)."""
    kept, out, report = _kept(cells + [TRAIN])
    ran = next(i for i, cell in enumerate(kept) if "exec(" in cell or "run(" in cell or "run_path(" in cell)
    assert ("NBDDP_IS_MAIN" not in kept[ran]) == every_rank, kept[ran]
    assert "NBDDP_IS_MAIN" not in kept[-1], kept[-1]
    assert ("nbddp cannot read the code" in report.format()) == ("code =" in cells[-1]), report.format()


def test_a_file_run_among_the_notebooks_names_that_trains_ends_training_there():
    """`%run -i train.py` trains on the notebook's data: that data stays on every rank, and what follows the line is
    rank 0's alone."""
    kept, out, _ = _kept(["from datasets import load_dataset\nds = load_dataset('x')\n",
                          "%%writefile train.py\n" + TRAIN, "%run -i train.py\n", SAVE])
    assert "NBDDP_IS_MAIN" not in "".join(kept[:3]) and "ds = load_dataset('x')" in kept[0], kept
    assert REST in out[2] or REST in out[3], out


def test_a_file_beside_the_notebook_that_it_runs_is_read_for_what_it_does(tmp_path):
    """`%run report` (report.py beside the notebook, which only sends) runs once; `%run settings.py`, whose names
    training reads, on every rank. Read from the folder, never run."""
    from conftest import make_notebook
    import nbformat
    from nbddp.pipeline import convert_notebook

    (tmp_path / "report.py").write_text(PING)
    (tmp_path / "settings.py").write_text("BATCH = 4\nraise SystemExit('never run by the converter')\n")
    path = tmp_path / "nb.ipynb"
    nbformat.write(make_notebook("%run report\n", "%run -e settings.py\n", "ds = rows[:BATCH]\n" + TRAIN), path)
    cells = [cell.source for cell in convert_notebook(str(path)).cells]
    assert "if NBDDP_IS_MAIN:\n    nbddp_run_file('report', globals())" in cells[0], cells[0]
    assert 'nbddp_barrier("%run report")' in cells[0], cells[0]  # what rank 1 says it waits for
    assert "NBDDP_IS_MAIN" not in cells[1], cells[1]


@pytest.mark.parametrize("cell", [
    "import torch\ns = torch.seed()\n",                                   # its value kept, never read by training
    "from torch import seed as reseed\nbase = reseed()\n",                # through an alias
    "import torch\ndef fresh():\n    return torch.random.seed()\nstart = fresh()\n",  # in a function
    "import torch\nstates = [torch.manual_seed(s) for s in range(2)]\n",  # in a comprehension
    "from transformers import set_seed as fix\nkept = fix(3)\n",        # a training library's, its value kept
])
def test_a_reseed_whose_value_the_notebook_keeps_still_runs_on_every_rank(cell):
    """`s = torch.seed()` reseeds torch's generator, which training draws from: every rank runs it (the runtime gives
    each rank the same seed), though training never reads `s`."""
    kept, _, _ = _kept([cell, "import torch\nnoise = torch.rand(3)\nds = [noise]\n" + TRAIN])
    assert "NBDDP_IS_MAIN" not in kept[0], kept[0]


@pytest.mark.parametrize("cells", [
    ["import sys\nsys.setrecursionlimit(10_000)\n"],
    ["from multiprocessing import set_start_method as start_with\n", "start_with('spawn', force=True)\n"],  # alias
    ["import resource as rs\ndef more_files():\n    soft, hard = rs.getrlimit(rs.RLIMIT_NOFILE)\n"
     "    rs.setrlimit(rs.RLIMIT_NOFILE, (hard, hard))\nmore_files()\n"],                  # in a function
    ["import signal, faulthandler\nfor sig in (signal.SIGTERM, signal.SIGUSR1):\n"
     "    signal.signal(sig, lambda s, f: print('stopping'))\nfaulthandler.enable()\n"],     # in a loop
    ["import socket, locale\nsocket.setdefaulttimeout(30)\nlocale.setlocale(locale.LC_ALL, 'C')\n"],
    ["import os, psutil\nos.sched_setaffinity(0, {0, 1})\npsutil.Process().nice(5)\n"],  # priority and affinity
    ["import numpy as np\nnp.seterr(all='raise')\n"],           # a library that computes: its options
    ["from tqdm.auto import tqdm\n", "tqdm.pandas()\n"],       # a registration, over cells
    ["import pandas as pd\ndef show_all():\n    pd.set_option('display.max_columns', None)\nshow_all()\n"],
    ["from sklearn import set_config as configure\nconfigure(transform_output='pandas')\n"],  # through an alias
    ["import decimal\nfor ctx in [decimal.getcontext()]:\n    decimal.setcontext(ctx)\n"
     "decimal.getcontext().prec = 40\n"],                        # in a loop; a value the library holds, changed
    ["from dotenv import load_dotenv as env_from\ndef settings():\n    env_from('.env')\nsettings()\n"],  # the environment
    ["import nest_asyncio\n", "nest_asyncio.apply()\n"],             # the event loop, over cells
    ["from pandarallel import pandarallel as pl\npl.initialize(progress_bar=False)\n"],  # pandas' parallel_apply
])
def test_what_a_process_sets_of_its_own_state_every_rank_sets(cells):
    """A recursion limit, a file limit, a signal handler, the workers' start method, a default socket timeout, the
    options of a library that computes (numpy's error handling, `tqdm.pandas()`'s `progress_apply`): each rank is a
    process of its own, and training there runs under them too (a second rank without the notebook's limit fails
    where the first does not; without `tqdm.pandas()`, `df.progress_apply` is an AttributeError there)."""
    kept, _, _ = _kept(cells + [TRAIN])
    assert not any("NBDDP_IS_MAIN" in cell for cell in kept[:-1]), kept


@pytest.mark.parametrize("cells", [
    ["import datasets\n", "datasets.disable_caching()\n"],                                    # over cells
    ["from datasets import disable_caching as no_cache\ndef quiet():\n    no_cache()\nquiet()\n"],  # alias, function
    ["import transformers\nfor name in ('transformers',):\n    transformers.logging.set_verbosity_error()\n"],
])
def test_set_up_of_the_datas_and_models_libraries_runs_on_every_rank_where_training_is_a_loop_of_its_own(cells):
    """`datasets.disable_caching()` where the notebook trains torch's model in a loop of its own: datasets is no
    library training's objects come from, but its module functions set the process's own state (each rank's)."""
    kept, _, _ = _kept(cells + [LOOP + "for i in range(3):\n" + STEP])
    assert not any("NBDDP_IS_MAIN" in cell for cell in kept[:-1]), kept


@pytest.mark.parametrize("cell", [
    "import numpy as np\nnp.savetxt('rows.txt', [1, 2])\n",              # a library that computes writes a file
    "import pandas as pd\npd.to_pickle({'a': 1}, 'rows.pkl')\n",
    "import os\nos.remove('old.txt')\n",                                # Python's own, outside the process
])
def test_what_writes_outside_the_process_stays_rank_0s(cell):
    kept, _, _ = _kept([cell, TRAIN])
    assert "if NBDDP_IS_MAIN" in kept[0], kept[0]


@pytest.mark.parametrize("before, test", [
    ("from dataclasses import dataclass\nimport os\n@dataclass\nclass Env:\n    rank: int = int(os.environ.get('RANK', 0))\n"
     "env = Env()\n", "env.rank == 1"),                                          # a dataclass's field
    ("import torch.distributed as dist\nclass Kit:\n    def __init__(self):\n        self.rank = dist.get_rank()\n"
     "kit = Kit()\n", "kit.rank == 1"),                                          # what __init__ assigns
    ("import os\nclass Job:\n    world = int(os.getenv('WORLD_SIZE', '1'))\n    def __init__(self):\n"
     "        self.index = int(os.environ['RANK'])\n    def last(self):\n        return self.index == self.world - 1\n"
     "job = Job()\n", "job.last()"),                                             # through a method of its own
])
def test_a_rank_the_notebooks_own_object_holds_is_read_by_its_value(before, test):
    """A class of the notebook's that holds the rank: the test of it after training runs on every rank (training's
    end moves to it), and the object is made on every rank."""
    out, _ = convert(before, TRAIN, f"if {test}:\n    open('one.txt', 'w').write('x')\n", "print('end')\n")
    assert "NBDDP_IS_MAIN" not in out[0], out[0]
    assert out[2].endswith(REST) and REST not in out[1], out


ALONE = [
    ["import requests\nrequests.post('https://x/hook', json={'start': 1})\n"],   # a web hook
    ["import urllib.request as u\nu.urlretrieve('https://x/d.csv', 'd.csv')\n"],  # a download through urllib
    ["import requests as rq\ndef hook(text):\n    rq.post('https://x/hook', json={'text': text})\nhook('go')\n"],
    ["import mylib as ml\n", "ml.notify('start')\n"],                             # an alias, over cells
    ["import urllib.request as u\ndef note(t):\n    with u.urlopen('http://x/?q=' + t) as r:\n        r.read()\n"
     "note('go')\n"],                                                           # Python's own reach, in a function
    ["import subprocess, sys\nsubprocess.run([sys.executable, 'prep.py'], check=True)\n"],  # a program started
    ["import subprocess as sp\ndef prep():\n    sp.run(['python', 'prep.py'])\n", "prep()\n"],  # alias, function
    ["import os\nname = 'a'\n", "os.system(f'python prep.py {name}')\n"],  # an f-string command (no path shared)
    ["import os\nos.system('python prep.py')\n"],                              # a command in one string
    ["import requests as rq\nurls = ['a', 'b']\n", "for u in urls:\n    rq.post('https://x/' + u)\n"],  # a loop
    ["import urllib.request as ur, os\nif not os.path.exists('d.csv'):\n    ur.urlretrieve('https://x/d', 'd.csv')\n"
     "else:\n    pass\n"],                                                      # a test around a download
]
STAYS = ["import mylib\nrows = mylib.fetch()\n", "from unsloth import PatchFastRL\nPatchFastRL('GRPO', None)\n",
         "import random\nrows = [1, 2]\nrandom.shuffle(rows)\n", "import os\nos.environ['A'] = '1'\n",
         "import os, sys, time\nos.makedirs('out')\ntime.sleep(1)\nsys.exit(0)\n",  # Python's own: as the process
         "from huggingface_hub import login\nlogin()\n",                            # a prompt: every rank asks
         "import mylib\ndef fit():\n    trainer.train()\nmylib.run(fit)\n",        # it may run what it is given
         "import subprocess, sys\nsubprocess.check_call([sys.executable, '-m', 'pip', 'install', 'x'])\n",  # installs
         "import subprocess\nproc = subprocess.Popen(['python', '-m', 'http.server'])\n",  # a handle, not a result
         "import subprocess as sp\ndef serve():\n    return sp.Popen(['python', '-m', 'http.server'])\nproc = serve()\n",
         "import subprocess, sys\nlog = subprocess.check_output([sys.executable, '-m', 'pip', 'install', 'x'])\n",
         "import mylib, subprocess\nrows = mylib.parse(subprocess.check_output(['ls']))\n",  # another library's value
         "import subprocess\ncmd = input()\nsubprocess.run(cmd, shell=True)\n",  # a command it cannot read
         "import requests\nrows = []\nfor u in ['a']:\n    rows.append(requests.get('https://x/' + u))\n",  # fills
         "import os\nfor d in ['a', 'b']:\n    os.makedirs(d)\n"]                      # Python's own, in a loop


@pytest.mark.parametrize("cells", ALONE)
def test_without_training_what_only_acts_outside_the_process_runs_once(cells):
    """A notebook with no training the analysis can see: a line that only calls another library for its effect (a
    hook, a download, an upload) runs on rank 0, the others waiting; what makes a value, sets up a training library,
    asks for a value or is Python's own (a folder, a sleep, an exit) stays on every rank. Before, each ran on every
    rank (the hook sent twice, the file downloaded twice)."""
    out, _ = convert(*cells, "x = 1\n")
    assert "if NBDDP_IS_MAIN:" in out[-2] and "nbddp_barrier(" in out[-2], out[-2]
    for cell in STAYS:
        assert "NBDDP_IS_MAIN" not in convert(cell, "x = 1\n")[0][0], cell


@pytest.mark.parametrize("cells, given", [
    (["import requests\nfor u in ['a', 'b']:\n    requests.post('https://x/' + u)\nlast = u\n"], '"u"'),
    (["import requests as rq\nfor a in ['x']:\n    for b in ['y']:\n        rq.post(a + b)\n", "print(a, b)\n"],
     '"a", "b"'),                                                                  # nested, read in a later cell
    (["import subprocess, sys\ndef best(x):\n    return x\n",
      "for lr in (1, 2):\n    subprocess.run([sys.executable, 'train.py', str(lr)])\nkept = best(lr)\n"], '"lr"'),
])
def test_without_training_a_loop_that_only_acts_outside_runs_once_and_every_rank_gets_its_variable(cells, given):
    """A loop of hooks, uploads or programs whose variable a later line reads: rank 0 runs it, and every rank gets
    rank 0's loop variables (before, every rank ran it: each post sent, each program run, once per rank)."""
    out, report = convert(*cells, "x = 1\n")
    loop = next(cell for cell in out if "for " in cell)
    assert "if NBDDP_IS_MAIN:\n    for " in loop and f"nbddp_share_values(globals(), {given})" in loop, loop
    assert "(a later line reads " in report.format()


RESULTS = [
    (["import subprocess, sys\nrc = subprocess.run([sys.executable, 'prep.py'], capture_output=True)\n"], "rc"),
    (["from subprocess import check_output as co\n", "rev: bytes = co(['git', 'rev-parse', 'HEAD'])\n"], "rev"),
    (["import os\nname = 'a'\n", "status = os.system(f'python prep.py {name}')\n"], "status"),  # over cells
    (["import subprocess as sp, sys\ndef launch():\n    return sp.run([sys.executable, 'prep.py'], check=True)\n",
      "rc = launch()\n"], "rc"),                                                    # the notebook's own function
    (["log = !python prep.py --epochs 1\n"], "log"),                              # IPython's `x = !cmd`
]


@pytest.mark.parametrize("cells, name", RESULTS)
def test_a_programs_result_training_reads_is_rank_0s_given_to_every_rank(cells, name):
    """Where training reads what a program gave back (its output names the data), rank 0 starts it once and every
    rank gets the result. Before, every rank started the program (a download script run twice)."""
    out, report = convert(*cells, f"from trl import SFTConfig\nargs = SFTConfig(output_dir=str({name}))\n" +
                          TRAIN.replace("ds)", "ds, args=args)"))
    assert f"if NBDDP_IS_MAIN:\n    {name}" in out[-2] and out[-2].endswith(f'nbddp_share_values(globals(), "{name}")\n')
    assert "NBDDP_IS_MAIN" not in out[-1], out[-1]


@pytest.mark.parametrize("cells, name", RESULTS)
def test_without_training_a_program_whose_result_is_kept_runs_once_and_every_rank_gets_the_result(cells, name):
    """A notebook with no training the analysis can see, and `%ddp`'s cells: a line that keeps what a program it
    starts gives back once it has ended (its exit status, its output) runs on rank 0, and every rank gets the value.
    Before, every rank started the program (each its own result)."""
    from nbddp.cellwise.history import History
    out, report = convert(*cells, f"size = len(str({name}))\n")
    assert f"if NBDDP_IS_MAIN:\n    {name}" in out[-2], out[-2]
    assert out[-2].endswith(f'nbddp_share_values(globals(), "{name}")\n'), out[-2]
    assert out[-1] == f"size = len(str({name}))\n"  # every rank has it
    assert f"every rank gets rank 0's {name}" in str(report), str(report)
    for before in ([], [TRAIN]):  # `%ddp`, also after a cell that trains
        session = History()
        for cell in before + cells:
            converted = session.convert(cell)
            session.accept(cell, converted)
        assert f'nbddp_share_values(globals(), "{name}")' in converted.code, converted.code


def test_a_ddp_sessions_cells_run_what_only_acts_outside_the_process_once():
    """`%ddp`: each cell converted as it comes, later cells unknown. A hook before training and after it runs on rank
    0; the values and set-up every rank may need later stay on every rank."""
    from nbddp.cellwise.history import History
    session, codes = History(), []
    for cell in [ALONE[0][0], STAYS[0] + STAYS[1], TRAIN.replace("ds)", "rows)"), "requests.post('https://x/done')\n"]:
        converted = session.convert(cell)
        session.accept(cell, converted)
        codes.append(converted.code)
    guarded = [code.split("requests.post(")[0].rstrip().endswith("if NBDDP_IS_MAIN:") or
               code.split("requests.post(")[0].endswith("if NBDDP_IS_MAIN:\n    nbddp_show(") for code in codes]
    assert guarded[0] and "NBDDP_IS_MAIN" not in codes[1], codes
    assert "NBDDP_IS_MAIN" not in codes[2] and guarded[3], codes


def test_a_ddp_sessions_loop_of_hooks_runs_once_and_gives_every_rank_its_variable_for_later_cells():
    """`%ddp`: later cells are unknown, so after a loop of hooks, which rank 0 runs, every rank gets its variable
    (a later cell may read it); a test around a hook binds nothing and runs once."""
    from nbddp.cellwise.history import History
    session, codes = History(), []
    for cell in ["import requests\nfor u in ['a', 'b']:\n    requests.post('https://x/' + u)\n",
                 "if requests:\n    requests.post('https://x/done')\n", "print(u)\n"]:
        converted = session.convert(cell)
        session.accept(cell, converted)
        codes.append(converted.code)
    assert "if NBDDP_IS_MAIN:\n    for u in" in codes[0] and 'nbddp_share_values(globals(), "u")' in codes[0], codes
    assert "if NBDDP_IS_MAIN:\n    if requests:" in codes[1] and "nbddp_share_values" not in codes[1], codes
