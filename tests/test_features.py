"""What the notebook asks of the runtime (nbddp.features): read once from the first tree, with the call-site decisions
that the placement and trainer-args steps carry out, and the runtime a function of it."""
import dataclasses

import libcst as cst
import pytest

from conftest import make_notebook
from nbddp.features import (ADD, COMPUTED, FULL, OWN, PLACED, SET, SPLIT, STARS, WRITE, ddp_setting, placement,
                            split_map)
from nbddp.pipeline import convert_notebook, run_pipeline
from nbddp.report import Report
from nbddp.transforms.base import Context


def call(code):
    return cst.parse_expression(code)


@pytest.mark.parametrize("code, where, kept", [
    ("M.from_pretrained('m')", ADD, None),
    ("M.from_pretrained('m', **extra)", STARS, None),
    ("M.from_pretrained('m', device_map = nbddp_device_map())", PLACED, None),
    ("M.from_pretrained('m', device_map = nbddp_device_map('auto'))", PLACED, "'auto'"),  # converted code
    ("M.from_pretrained('m', device_map = 'balanced')", SPLIT, "'balanced'"),
    ("M.from_pretrained('m', device_map = {'': 0})", OWN, None),
    ("M.from_pretrained('m', device_map = None)", OWN, None),
    ("M.from_pretrained('m', device_map = 'cuda:0')", OWN, None),
    ("M.from_pretrained('m', device_map = pick())", COMPUTED, None),
])
def test_where_a_load_puts_the_model(code, where, kept):
    assert placement(call(code)) == where
    found = split_map(call(code))
    assert (found if found is None else cst.Module([]).code_for_node(found)) == kept


@pytest.mark.parametrize("code, adapters, setting", [
    ("C(output_dir = 'o')", True, WRITE),
    ("C(output_dir = 'o')", False, FULL),
    ("C(output_dir = 'o', **extra)", True, STARS),
    ("C(output_dir = 'o', **extra)", False, FULL),
    ("C(ddp_find_unused_parameters = True)", True, SET),
    ("C(ddp_find_unused_parameters = False, **extra)", False, SET),
])
def test_what_becomes_of_a_configurations_unused_parameters_search(code, adapters, setting):
    assert ddp_setting(call(code), adapters) == setting


def features(*cells):
    ctx = Context(report=Report(source="test.ipynb"))
    run_pipeline(make_notebook(*cells), ctx)
    return ctx.tree.features, ctx


# the same notebook facts through the notebook's own function, an alias, a loop, over cells
LOADS = [
    ("from transformers import AutoModelForCausalLM as Auto\nmodel = Auto.from_pretrained('org/a', load_in_8bit = True, "
     "device_map = 'auto')\n",),
    ("import transformers\nLoader = transformers.AutoModelForCausalLM\n",
     "def load(name):\n    return Loader.from_pretrained('org/a', load_in_8bit = True, device_map = 'auto')\n"
     "model = load('x')\n"),
    ("from transformers import AutoModelForCausalLM\nfor attempt in range(2):\n"
     "    model = AutoModelForCausalLM.from_pretrained('org/a', load_in_8bit = True, device_map = 'auto')\n",),
]


@pytest.mark.parametrize("cells", LOADS)
def test_a_load_is_read_however_the_notebook_spells_it(cells):
    found, ctx = features(*cells)
    assert [(m, bits, placed) for m, bits, _, placed in found.models] == [("org/a", 8, "'auto'")]
    assert found.quantized and found.split_model
    assert "fit" in ctx.runtime.reasons


def test_the_facts_are_the_notebooks_not_what_the_steps_wrote():
    """TrainerArgs writes ddp_find_unused_parameters=False and Placement writes nbddp_device_map(): neither is the
    notebook's own setting; converting the converted code finds the same facts."""
    cells = ("from unsloth import FastLanguageModel\n"
             "model, tok = FastLanguageModel.from_pretrained('org/m', device_map = 'sequential')\n"
             "model = FastLanguageModel.get_peft_model(model, r = 8, use_gradient_checkpointing = 'unsloth')\n",
             "from trl import SFTConfig, SFTTrainer\nconfig = SFTConfig(output_dir = 'o')\n"
             "trainer = SFTTrainer(model = model, args = config)\ntrainer.train()\n")
    found, ctx = features(*cells)
    assert found.adapters and found.checkpointing and found.split_model and not found.own_ddp
    assert "strategy" not in ctx.runtime.reasons and "xformers_shim" in ctx.runtime.reasons
    again, _ = features(*[cell.source for cell in convert_notebook(make_notebook(*cells)).cells])
    assert dataclasses.asdict(again) == dataclasses.asdict(found)


@pytest.mark.parametrize("setting, carried", [("True", True), ("False", False), ("flags.search", True)])
def test_the_notebooks_own_search_setting_decides_the_strategy(setting, carried):
    found, ctx = features("from unsloth import FastLanguageModel\nfrom trl import SFTConfig, SFTTrainer\n"
                          "model, tok = FastLanguageModel.from_pretrained('org/m')\n"
                          "model = FastLanguageModel.get_peft_model(model, use_gradient_checkpointing = True)\n",
                          f"trainer = SFTTrainer(model = model, args = SFTConfig(ddp_find_unused_parameters = {setting}))"
                          "\ntrainer.train()\n")
    assert bool(found.own_ddp) == carried == ("strategy" in ctx.runtime.reasons)


def test_a_prompt_says_whether_rank_0_alone_asks():
    """The analysis finds the prompts; whether rank 0 alone asks is where the guard step put the call: a value
    training reads is asked on rank 0 and given to every rank, one it does not read is asked in rank 0's block."""
    _, ctx = features("import getpass\nask = getpass.getpass\nsecret = ask('token: ')\n",
                      "remark = input('note: ')\nprint(remark)\n",
                      "import torch\nloss = torch.ones(len(secret), requires_grad = True).sum()\nloss.backward()\n")
    said = {n.cell: n.text for n in ctx.report.changes if "asks" in n.text}
    assert said[1].startswith("getpass(): rank 0 asks, every rank gets the answer"), said
    assert said[2].startswith("input(): in a rank-0-only block: only rank 0 asks"), said


def test_what_a_function_of_a_module_of_its_own_asks_for_counts():
    """`%%writefile fit_lib.py` builds the Trainer and loads the model: the script carries what a Trainer and a
    sized model need, as where the notebook's cells do it (before, neither was seen)."""
    found, ctx = features("%%writefile fit_lib.py\nfrom transformers import AutoModelForCausalLM as Auto, Trainer\n"
                          "def load():\n    return Auto.from_pretrained('org/x', load_in_4bit = True)\n"
                          "def go(model, rows):\n    return Trainer(model = model, train_dataset = rows).train()\n",
                          "import fit_lib as fl\nmodel = fl.load()\n", "stats = fl.go(model, rows)\n")
    assert found.trainer and found.quantized and found.models == [("org/x", 4, 2, "none")]
    assert {"global_batch", "balance", "fit", "lean_sync"} <= set(ctx.runtime.reasons)
