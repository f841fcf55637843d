"""Before/after tests for each pipeline step, through the whole pipeline, one small notebook per case.

Each case is the cell a notebook holds and the cell the script must hold; the `UNCHANGED` cases are code the
converter must leave exactly as it is, and the warning cases are code it must not guess about.
"""
from __future__ import annotations

import textwrap

import pytest

from conftest import make_notebook
from nbddp.errors import ConversionError
from nbddp.pipeline import run_pipeline
from nbddp.report import Report
from nbddp.transforms.base import Context, Options

REST = "# nbddp: training ends here; rank 0 runs the rest alone, the other ranks wait for it\nnbddp_rest_on_rank0()\n"


def convert_cells(*sources, options=None):
    """The converted source of each code cell, and the report."""
    ctx = Context(report=Report(source="test.ipynb"), options=options or Options())
    nb = run_pipeline(make_notebook(*sources), ctx)
    return [cell.source for cell in nb.cells], ctx.report


def convert_cell(source):
    sources, report = convert_cells(textwrap.dedent(source))
    return sources[0], report


def case(before, after):
    return pytest.param(textwrap.dedent(before), textwrap.dedent(after), id=before.strip().splitlines()[0][:40])


MAGICS = [
    case("if True:\n    !pip install x\n",
         "if True:\n    pass  # nbddp: removed `!pip install x` (install; see the header)\n"),
    case("import os\nif os.environ.get('X'):\n    !pip install x\nelse:\n    !pip install y\n    import re\n",
         "import os\nif os.environ.get('X'):\n    pass  # nbddp: removed `!pip install x` (install; see the header)\n"
         "else:\n    # nbddp: removed `!pip install y` (install; see the header)\n    import re\n"),
    case("!pip install a \\\n   b\nimport os\n",
         "# nbddp: removed `!pip install a b` (install; see the header)\nimport os\n"),
    case("#@title Setup\n%%capture\n!pip install x\nimport os\nos.environ['A'] = '1'\n",
         "#@title Setup\n# nbddp: %%capture dropped; the cell's code is kept\n"
         "# nbddp: removed `!pip install x` (install; see the header)\nimport os\nos.environ['A'] = '1'\n"),
    case("x = 1\n%env K=V\n%env HF_HOME /tmp/hf\n",
         "x = 1\nos.environ['K'] = 'V'\nos.environ['HF_HOME'] = '/tmp/hf'\n"),
    case("%env K = 1 # why\n", "os.environ['K'] = '1 # why'\n"),  # what IPython sets too (and a warning)
    case("%cd /tmp/work\nx = 1\n", "os.chdir(os.path.expanduser('/tmp/work'))\nx = 1\n"),
    case("files = !ls\n", "if NBDDP_IS_MAIN:\n    files = nbddp_getoutput('ls')\nnbddp_barrier(\"!ls\")\n"
                           "nbddp_share_values(globals(), \"files\")\n"),  # no training: run once, given to all
    case("%run prep.py --rows 3\nx = ROWS\n", "nbddp_run_file('prep.py --rows 3', globals())\nx = ROWS\n"),
    case("def go(n):\n    %run -i prep --rows {n}\n",
         "def go(n):\n    nbddp_run_file(nbddp_expand('-i prep --rows {n}'), globals())\n"),
    case("%%writefile -a out.txt\nhello\n",
         "# nbddp: %%writefile -a out.txt\nnbddp_write_file('out.txt', 'hello\\n', append=True)\n"),
    case('%%writefile "my file.txt"\nhi\n', '# nbddp: %%writefile "my file.txt"\nnbddp_write_file(\'my file.txt\', \'hi\\n\')\n'),
    case("%%file run.py\nprint(1)\n", "# nbddp: %%file run.py\nnbddp_write_file('run.py', 'print(1)\\n')\n"),
    case("%%bash\necho hi\nls\n", "# nbddp: %%bash\nnbddp_shell('echo hi\\nls\\n', shell='/bin/bash')\n"),
    case("%%bash\npip install a\npip install b\n",
         "# nbddp: removed a %%bash install cell; run it before launching (see the header)\n"),
    case("%time y = f(1)\n", "y = f(1)\n"),
    case("%%time\nz = 3\n", "# nbddp: %%time dropped; the cell's code is kept\nz = 3\n"),
    case("%matplotlib inline\nimport os\n", "# nbddp: removed `%matplotlib inline` (notebook-only)\nimport os\n"),
    case("!nvidia-smi\n", "nbddp_shell('nvidia-smi')\n"),
    case("%%html\n<b>hi</b>\n", "# nbddp: removed a %%html cell (display only)\n"),
]

PLACEMENT = [
    case('model = AutoModelForCausalLM.from_pretrained("m")\n',
         'model = AutoModelForCausalLM.from_pretrained("m", device_map=nbddp_device_map())\n'),
    # Unsloth's model-specific loaders, and a loader under the notebook's own name
    case('from unsloth import FastQwen2Model\nmodel, tok = FastQwen2Model.from_pretrained("m")\n',
         'from unsloth import FastQwen2Model\nmodel, tok = FastQwen2Model.from_pretrained("m", '
         'device_map=nbddp_device_map())\n'),
    case('from unsloth import FastLanguageModel as FLM\nmodel, tok = FLM.from_pretrained("m")\n',
         'from unsloth import FastLanguageModel as FLM\nmodel, tok = FLM.from_pretrained("m", '
         'device_map=nbddp_device_map())\n'),
    case('model = AutoModelForCausalLM.from_pretrained("m", device_map={"": 0})\n',
         'model = AutoModelForCausalLM.from_pretrained("m", device_map=nbddp_device_map())\n'),
    case('model, tok = FastLanguageModel.from_pretrained(\n    model_name = "m",\n    load_in_4bit = True,\n'
         '    # token = "hf_...", # gated models\n)\n',
         'model, tok = FastLanguageModel.from_pretrained(\n    model_name = "m",\n    load_in_4bit = True,\n'
         '    # token = "hf_...", # gated models\n    device_map = nbddp_device_map(),\n)\n'),
    case('model = AutoModelForCausalLM.from_pretrained("m", device_map=None)\n',
         'model = AutoModelForCausalLM.from_pretrained("m", device_map=nbddp_device_map())\n'),
    case('x = batch.to("cuda:0")\ndev = torch.device("cuda:1")\ny = batch.to(device="cuda:0", non_blocking=True)\n',
         'x = batch.to(NBDDP_DEVICE)\ndev = torch.device(NBDDP_DEVICE)\ny = batch.to(device=NBDDP_DEVICE, non_blocking=True)\n'),
    # a loader in a function still loads on every rank when called: it gets the rank's own device too
    case('def load():\n    return AutoModelForCausalLM.from_pretrained("m")\n',
         'def load():\n    return AutoModelForCausalLM.from_pretrained("m", device_map=nbddp_device_map())\n'),
]

TRAINER_ARGS = [
    case('import peft\nargs = TrainingArguments(output_dir="o", peft_config=peft.LoraConfig(r=8))\n',
         'import peft\nargs = TrainingArguments(output_dir="o", peft_config=peft.LoraConfig(r=8), '
         'ddp_find_unused_parameters=False)\n'),
    case('from peft import LoraConfig\ncfg = LoraConfig(r=8)\nargs = GRPOConfig(\n    lr = 1e-5,\n    max_steps = 5, # short\n)\n',
         'from peft import LoraConfig\ncfg = LoraConfig(r=8)\nargs = GRPOConfig(\n    lr = 1e-5,\n    max_steps = 5, # short\n'
         '    ddp_find_unused_parameters = False,\n)\n'),
    case('args = TrainingArguments(output_dir="o")\n',  # a full fine-tune: the Trainer's default stays
         'args = TrainingArguments(output_dir="o")\n'),
]

DATA_PREP = [
    case('ds = load_dataset("x")\nds = ds.map(f, batched=True)\nprint(1)\n',
         'with nbddp_main_process_first():\n    ds = load_dataset("x")\n    ds = ds.map(f, batched=True)\n'
         'if NBDDP_IS_MAIN:\n    print(1)\nnbddp_barrier("print")\n'),
    case('split = ds.train_test_split(test_size=0.1)\n',
         'with nbddp_main_process_first():\n    split = ds.train_test_split(test_size=0.1, seed=3407)\n'),
    case('a, b = train_test_split(X, test_size=0.2)\n',  # scikit-learn's: a seed, no dataset cache to order
         'a, b = train_test_split(X, test_size=0.2, random_state=3407)\n'),
    case('ds = ds.shuffle()\n', 'ds = ds.shuffle(seed=3407)\n'),
    # a function runs on every rank when called: no main-process-first around its body, but the split is seeded
    case('def split(ds):\n    return ds.train_test_split(test_size=0.1)\n',
         'def split(ds):\n    return ds.train_test_split(test_size=0.1, seed=3407)\n'),
    case('for name in names:\n    parts.append(load_dataset(name))\n',
         'for name in names:\n    with nbddp_main_process_first():\n        parts.append(load_dataset(name))\n'),
]

RANK_GUARDS = [
    # generation handed over rather than called, and what consumes it
    case('streamer = TextIteratorStreamer(tok)\nthread = Thread(target=model.generate, kwargs=dict(streamer=streamer))\n'
         'thread.start()\nfor text in streamer:\n    print(text, end="")\n',
         'if NBDDP_IS_MAIN:\n    streamer = TextIteratorStreamer(tok)\n'
         '    thread = Thread(target=model.generate, kwargs=dict(streamer=streamer))\n    thread.start()\n'
         '    for text in streamer:\n        print(text, end="")\nnbddp_barrier("TextIteratorStreamer")\n'),
    case('gen = partial(model.generate, max_new_tokens=8)\nout = gen(**inputs)\n',
         'if NBDDP_IS_MAIN:\n    gen = partial(model.generate, max_new_tokens=8)\n    out = gen(**inputs)\nnbddp_barrier("generate")\n'),
    case('pipe = pipeline("text-generation", model=model)\nres = pipe("hi")\n',
         'if NBDDP_IS_MAIN:\n    pipe = pipeline("text-generation", model=model)\n    res = pipe("hi")\nnbddp_barrier("pipeline")\n'),
    case('def ask(q):\n    return model.generate(q)\n\ndef chat(q):\n    return ask(q)\n\nanswer = chat("hi")\n',
         'def ask(q):\n    return model.generate(q)\n\ndef chat(q):\n    return ask(q)\n\n'
         'if NBDDP_IS_MAIN:\n    answer = chat("hi")\nnbddp_barrier("chat")\n'),
    case('model.save_pretrained("x")\ntokenizer.push_to_hub("y")\n',
         'if NBDDP_IS_MAIN:\n    model.save_pretrained("x")\n    tokenizer.push_to_hub("y")\nnbddp_barrier("save_pretrained")\n'),
    case('out = model.generate(**inputs)\nprint(tok.decode(out[0]))\n',
         'if NBDDP_IS_MAIN:\n    out = model.generate(**inputs)\n    print(tok.decode(out[0]))\nnbddp_barrier("generate")\n'),
    case('model.save_lora("l")\nx = 1\n', 'if NBDDP_IS_MAIN:\n    model.save_lora("l")\nnbddp_barrier("save_lora")\nx = 1\n'),
    case('for i in range(3):\n    trainer.save_model(f"x{i}")\n',
         'for i in range(3):\n    if NBDDP_IS_MAIN:\n        trainer.save_model(f"x{i}")\n    nbddp_barrier("save_model")\n'),
    case('stats = torch.cuda.max_memory_reserved()\n',
         'if NBDDP_IS_MAIN:\n    stats = torch.cuda.max_memory_reserved()\nnbddp_barrier("max_memory_reserved")\n'),
    case('print("start")\nprint(trainer.train())\n',
         'if NBDDP_IS_MAIN:\n    print("start")\nnbddp_barrier("print")\nnbddp_train = trainer.train()\n'
         f'{REST}print(nbddp_train)\n'),
]

AUTOCAST = [
    case('with torch.cuda.amp.autocast(dtype=torch.float16):\n    y = m(x)\nscaler = torch.cuda.amp.GradScaler()\n',
         'with torch.amp.autocast("cuda", dtype=torch.float16):\n    y = m(x)\nscaler = torch.amp.GradScaler("cuda")\n'),
]

UNCHANGED = [
    'clf = pipeline("text-classification", model=m)\nlabels = clf(texts)\n',  # not generation: every rank may run it
    'worker = Thread(target=load_shard, args=(1,))\nworker.start();\n',  # `;`: the cell shows nothing
    'from other import FastLanguageModel as FLM\ntok = FLMTokenizer.from_pretrained("m")\n',  # not a model loader
    'tok = FastTokenizer.from_pretrained("m")\n',
    'def save():\n    model.save_pretrained("x")\n    out = model.generate(x)\n    print(out)\n',
    'def tokenize(ds):\n    ds = load_dataset("x")\n    return ds.map(g)\n',
    'if False:\n    model.save_pretrained("x")\n    model = AutoModelForCausalLM.from_pretrained("m")\n'
    '    args = SFTConfig(output_dir="o")\n    ds = load_dataset("x")\n',
    'if False: model.push_to_hub_merged("me/m", tok, token = "T")\n',
    'if NBDDP_IS_MAIN:\n    model.save_pretrained("x")\n    print("saved")\n',
    'import torch.distributed as dist\nrank = dist.get_rank()\nif rank == 0:\n    model.save_pretrained("x")\n',
    'import os\nif int(os.environ.get("RANK", "0")) == 0:\n    model.save_pretrained("x")\n',  # a barrier there: a hang
    'import os\nmain = int(os.environ["RANK"]) == 0\nif main:\n    model.save_pretrained("x")\n',  # through its value
    'from torch import distributed as dist\nis_zero = dist.get_rank() == 0\nif is_zero and epoch > 0:\n    torch.save(model.state_dict(), "x.pt")\n',
    'if trainer.is_world_process_zero():\n    trainer.save_model("x")\n',
    'args = SFTConfig(output_dir="o", ddp_find_unused_parameters=True)\n',
    'with nbddp_main_process_first():\n    ds = load_dataset("x")\n',
    'trainer = SFTTrainer(model=model, train_dataset=ds.map(f))\n',  # all ranks build the trainer together
    'model = AutoModelForCausalLM.from_pretrained("m", device_map=nbddp_device_map())\n',
    'model = PeftModel.from_pretrained(base, "a")\ntok = AutoTokenizer.from_pretrained("m")\n',
    'with torch.amp.autocast("cuda"):\n    y = m(x)\n',
    'x = batch.to("cuda")\nprint_later = "cuda:0"\n',
    'x = [1, 2]\nstats = trainer.train()\n',
    'model = FastLanguageModel.get_peft_model(model, r=16, target_modules=["q_proj", "v_proj"])\n',  # no shared file
    'model = FastLanguageModel.get_peft_model(model, target_modules=["lm_head"], temporary_location="/tmp/x")\n',
    'import os\nos.environ["A"] = "1"  # a comment\n',
]


SCRATCH = [
    case('model = FastLanguageModel.get_peft_model(model, r=16, target_modules=["q_proj", "embed_tokens", "lm_head"])\n',
         'model = FastLanguageModel.get_peft_model(model, r=16, target_modules=["q_proj", "embed_tokens", "lm_head"], '
         'temporary_location=f"_unsloth_temporary_saved_buffers/rank{NBDDP_RANK}")\n'),
]


@pytest.mark.parametrize("before, after", MAGICS + PLACEMENT + SCRATCH + TRAINER_ARGS + DATA_PREP + RANK_GUARDS + AUTOCAST)
def test_rewrite(before, after):
    converted, _ = convert_cell(before)
    assert converted == after


@pytest.mark.parametrize("source", UNCHANGED, ids=[s.splitlines()[0][:40] for s in UNCHANGED])
def test_left_as_is(source):
    converted, report = convert_cell(source)
    assert converted == source
    assert not report.warnings


def test_seeded_split_is_kept():
    converted, report = convert_cell('split = ds.train_test_split(test_size=0.1, seed=1)\n')
    assert "seed=1)" in converted and "3407" not in converted
    assert not any("seed" in n.text for n in report.changes)


@pytest.mark.parametrize("source, expected, warning", [
    ("%env K = 1 # why\n", "os.environ['K'] = '1 # why'\n", "comment included"),  # as IPython sets it, no guess
    ('model = AutoModelForCausalLM.from_pretrained("m", **kw)\n', None, "cannot tell if device_map is set"),
    ('model = AutoModelForCausalLM.from_pretrained("m", device_map=dm)\n', None, "computed by the notebook"),
    ('import peft\nc = peft.LoraConfig()\nargs = SFTConfig(**cfg)\n', None,
     "cannot tell if ddp_find_unused_parameters is set"),
])
def test_no_guessing_only_a_warning(source, expected, warning):
    """Unchanged (or, for a magic, only turned into the Python IPython would run), with a warning."""
    converted, report = convert_cell(source)
    assert converted == (expected or source)
    assert any(warning in n.text for n in report.warnings), report.warnings


def test_splitting_device_map_is_replaced_and_warned():
    # the notebook's own placement stays for split mode (one process, the model over every GPU: runtime/fit.py)
    converted, report = convert_cell('m = FastLanguageModel.from_pretrained("m", device_map="balanced")\n')
    assert converted == 'm = FastLanguageModel.from_pretrained("m", device_map=nbddp_device_map("balanced"))\n'
    assert any('device_map="balanced"' in n.text and "decided at run time" in n.text for n in report.warnings)
    again, _ = convert_cell(converted)
    assert again == converted


@pytest.mark.parametrize("source, warning", [
    ("%frobnicate now\nx = 1\n", "unknown magic `%frobnicate now`"),
    ("%%frobnicate\nx = 1\n", "unknown cell magic `%%frobnicate`"),
    ("%run other.ipynb\nx = 1\n", "`%run other.ipynb` removed: the converter cannot read"),  # none beside it
])
def test_unknown_magics_are_removed_and_warned(source, warning):
    converted, report = convert_cell(source)
    assert converted.startswith("# nbddp: removed") and source.split()[0].lstrip("%") in converted.splitlines()[0]
    assert [n.text for n in report.warnings if warning in n.text]


def test_installs_go_to_the_header_list():
    _, report = convert_cells("!pip install a\n%pip install b\n", "%%bash\nset -e\nuv pip install c\n")
    assert report.installs == ["pip install a", "pip install b", "uv pip install c"]
    assert any("install cell also runs 1 other shell line" in n.text for n in report.warnings)


def test_windows_newlines_become_one_style():
    sources, _ = convert_cells("x = 1\r\n!pip install y\r\n")
    assert sources == ["x = 1\n# nbddp: removed `!pip install y` (install; see the header)\n"]


def test_install_through_the_notebooks_own_python():
    converted, report = convert_cell("!{sys.executable} -m pip install x\n")
    assert converted.startswith("pass  # nbddp: removed")
    assert report.installs == ["python -m pip install x"]


def test_ipython_called_by_name_is_rewritten_and_what_is_left_of_it_is_warned():
    converted, report = convert_cell("ip = get_ipython()\n!ls\nip.system('echo $HOME')\n")
    assert converted == "ip = get_ipython()\nnbddp_shell('ls')\nnbddp_shell(nbddp_expand('echo $HOME'))\n"
    assert not report.warnings
    sources, report = convert_cells("shell = get_ipython()\n", "shell.user_ns['x'] = 1\n")  # over cells
    assert sources[1] == "shell.user_ns['x'] = 1\n"
    assert any("calls get_ipython() itself" in n.text for n in report.warnings)


@pytest.mark.parametrize("cell, written", [
    ("get_ipython().run_cell_magic('writefile', 'a.py', 'x = 1\\n')\n", "nbddp_write_file('a.py', 'x = 1\\n')\n"),
    ("def setup():\n    get_ipython().run_cell_magic('bash', '', 'echo hi\\n')\n",
     "def setup():\n    nbddp_shell('echo hi\\n', shell='/bin/bash')\n"),
    ("ip = get_ipython()\nip.run_line_magic('pip', 'install x')\n",
     "ip = get_ipython()\n# nbddp: removed `%pip install x` (install; see the header)\n"),
    # its methods under names of their own, and arguments computed when the script runs
    ("magic = get_ipython().run_line_magic\nmagic('env', 'A=1')\n",
     "# nbddp: `magic` stands for get_ipython().run_line_magic: its calls are rewritten as IPython's\n"
     "os.environ['A'] = '1'\n"),
    ("ip = get_ipython()\nrun = ip.system\nfor c in cmds:\n    run(c)\n",
     "for c in cmds:\n    nbddp_shell(nbddp_expand(c))\n"),
    ("def save(path, text):\n    get_ipython().run_cell_magic('writefile', path, text)\n",
     "def save(path, text):\n    nbddp_write_file(nbddp_expand(path), text)\n"),
    ("def sh(line, body):\n    get_ipython().run_cell_magic('bash', line, body)\n",
     "    nbddp_shell(body, shell='/bin/bash', args=nbddp_expand(line))\n"),
    ("ip = get_ipython()\nfor k, v in opts.items():\n    ip.run_line_magic('env', f'{k}={v}')\n",
     "for k, v in opts.items():\n    nbddp_env(nbddp_expand(f'{k}={v}'))\n"),
    ("def go(folder):\n    get_ipython().run_line_magic('cd', folder)\n",
     "def go(folder):\n    os.chdir(os.path.expanduser(nbddp_expand(folder)))\n"),
])
def test_ipython_called_by_name_means_what_the_magic_means(cell, written):
    converted, report = convert_cell(cell)
    assert written in converted, converted
    assert not report.warnings


def test_magic_after_a_semicolon_is_an_error_of_the_magics_step():
    with pytest.raises(ConversionError, match=r"^cell 1, line 1: not valid Python") as raised:
        convert_cells("print(1); !ls\n")
    assert raised.value.step == "magics"  # for a bug report; not in the user's line


def test_taint_follows_values_across_cells():
    """A value made on rank 0 only (generation output) is read under the same guard in a later cell."""
    sources, _ = convert_cells('out = model.generate(x)\n', ("markdown", "text"), 'text = tok.decode(out[0])\ny = 2\n')
    assert sources[1] == 'if NBDDP_IS_MAIN:\n    text = tok.decode(out[0])\nnbddp_barrier("decode")\ny = 2\n'


def test_a_cell_that_does_not_parse_names_cell_and_line():
    with pytest.raises(ConversionError) as err:
        convert_cells("x = 1\n", ("markdown", "m"), "a = 1\nb = (\n")
    message = str(err.value)
    assert "cell 3" in message and "line" in message and "\n" not in message


def test_plain_script_is_the_cells_after_the_text_steps_and_the_helpers_they_call(tmp_path):
    """nbddp.pipeline.plain_script, the benchmarks' baseline: the code cells with IPython's lines rewritten as in a
    converted script, after the runtime helpers those lines call; nothing of the DDP conversion. It runs as one
    process."""
    import subprocess
    import sys

    from nbddp.pipeline import plain_script

    nb = make_notebook("!pip install x\nimport os\n", ("markdown", "text"), "%%writefile notes.txt\nhello\n",
                       "name = 'notes.txt'\nlines = !cat $name\ndevice = 'cuda:0'\nprint(lines.s, device)\n")
    text = plain_script(nb, source_name="t.ipynb")
    cells = text[text.index("# %% cell 1"):]
    assert text.startswith('"""t.ipynb as a plain script')
    assert cells == ("# %% cell 1\n# nbddp: removed `!pip install x` (install; see the header)\nimport os\n\n"
                     "# %% cell 3\n# nbddp: %%writefile notes.txt\nnbddp_write_file('notes.txt', 'hello\\n')\n\n"
                     "# %% cell 4\nname = 'notes.txt'\nlines = nbddp_getoutput(nbddp_expand('cat $name'))\n"
                     "device = 'cuda:0'\nprint(lines.s, device)\n")
    assert "def nbddp_write_file(" in text and "def nbddp_expand(" in text and "nbddp_start(" not in text
    (tmp_path / "plain.py").write_text(text)
    done = subprocess.run([sys.executable, "plain.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello cuda:0\n"

    bare = plain_script(make_notebook("x = 1\n", "print(x)\n"), source_name="b.ipynb")  # no IPython lines: no helpers
    assert bare == ('"""b.ipynb as a plain script (nbddp.pipeline.plain_script): no DDP changes."""\n'
                    "# %% cell 1\nx = 1\n\n# %% cell 2\nprint(x)\n")
