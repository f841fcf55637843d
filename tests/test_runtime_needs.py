"""Which runtime modules a script carries (the `runtime` step) and how they are inlined (nbddp.inline)."""
import ast
import json
import sys
from pathlib import Path

import pytest

from conftest import make_notebook, need_corpus
from nbddp import inline
from nbddp.pipeline import convert_notebook
from nbddp.runtime import MODULES
from nbddp.transforms.base import Options

RUNTIME = Path(inline.__file__).parent / "runtime"




def carried(*cells, **options):
    """The runtime modules the script carries: those chosen, and what they import from."""
    return set(inline.closure(convert_notebook(make_notebook(*cells), options=Options(**options)).runtime.reasons))


UNSLOTH_SFT = (
    "from unsloth import FastLanguageModel\n"
    "model, tokenizer = FastLanguageModel.from_pretrained('m', load_in_4bit = True)\n"
    "model = FastLanguageModel.get_peft_model(model, r = 16, use_gradient_checkpointing = 'unsloth')\n",
    "from trl import SFTConfig, SFTTrainer\n"
    "trainer = SFTTrainer(model = model, train_dataset = data, args = SFTConfig(per_device_train_batch_size = 2))\n"
    "trainer.train()\n",
)


@pytest.mark.parametrize("cells, options, wanted, not_wanted", [
    # plain torch, no Trainer: the rank facts, the process group, the self-launch, one writer (saves and files),
    # the agreement check
    (("import torch\nx = torch.ones(1)\nprint(x)\n",), {},
     {"hash_seed", "group", "same_random", "launcher", "wait", "one_writer", "files", "file_races", "agree", "stdin_fd",
      "owner"},
     {"balance", "strategy", "lean_sync", "tiled_mlp", "peft_shim", "xformers_shim", "global_batch", "fit", "ask"}),
    # input() is asked on rank 0 only; a variable named input is not a call
    (("answer = input('Go on? ')\n",), {}, {"ask"}, set()),
    (("for instruction, input, output in rows:\n    text = input\n",), {}, set(), {"ask"}),
    # a model from the hub is sized at run time; one the notebook saves itself is not there yet at the start
    (("from transformers import AutoModelForCausalLM\nname = 'org/model'\n"
      "model = AutoModelForCausalLM.from_pretrained(name)\n",), {}, {"fit"}, set()),
    (("from transformers import AutoModelForCausalLM\nbase.save_pretrained('./mine')\n"
      "model = AutoModelForCausalLM.from_pretrained('./mine')\n",), {}, set(), {"fit"}),
    (("from transformers import AutoModelForCausalLM\nmodel = AutoModelForCausalLM.from_pretrained(pick())\n",),
     {}, set(), {"fit"}),
    # a transformers Trainer, full precision, no checkpointing: length balancing only
    (("from transformers import Trainer, TrainingArguments\n"
      "trainer = Trainer(model = model, args = TrainingArguments(output_dir = 'o'), train_dataset = d)\n",),
     {}, {"group", "balance"}, {"strategy", "lean_sync", "tiled_mlp", "peft_shim", "xformers_shim"}),
    # Unsloth's usual SFT notebook: the converter's ddp_find_unused_parameters=False holds, so no run-time strategy
    (UNSLOTH_SFT, {}, {"group", "lean_sync", "peft_shim", "balance"}, {"strategy", "tiled_mlp", "xformers_shim"}),
    # the notebook's own DDP settings with checkpointing: decided at run time
    (("from transformers import Trainer, TrainingArguments\n"
      "args = TrainingArguments(output_dir = 'o', gradient_checkpointing = True, ddp_find_unused_parameters = True)\n"
      "trainer = Trainer(model = model, args = args)\n",), {}, {"strategy", "balance"}, {"lean_sync"}),
    (("from transformers import Trainer, TrainingArguments\nmodel.gradient_checkpointing_enable()\n"
      "trainer = Trainer(model, args = TrainingArguments(output_dir = 'o', **extra))\n",), {}, {"strategy"}, set()),
    (("import transformers\nmodel.gradient_checkpointing_enable()\ntrainer = transformers.Trainer(model = model)\n",),
     {}, {"strategy", "balance"}, set()),
    # Unsloth's TiledMLP is asked for by keyword or by its environment variable
    (UNSLOTH_SFT[:1] + ("model2 = FastLanguageModel.from_pretrained('m', unsloth_tiled_mlp = True)\n",), {},
     {"tiled_mlp"}, set()),
    (("import os\nos.environ['UNSLOTH_TILED_MLP'] = 'arctic'\nfrom unsloth import FastModel\n",), {},
     {"tiled_mlp"}, set()),
    (UNSLOTH_SFT[:1] + ("model2 = FastLanguageModel.from_pretrained('m', unsloth_tiled_mlp = False)\n",), {},
     set(), {"tiled_mlp"}),
    # a device_map the notebook computes may spread the model over GPUs in one process
    (("from unsloth import FastLanguageModel\nmodel = FastLanguageModel.from_pretrained('m', device_map = dm)\n",),
     {}, {"xformers_shim"}, set()),
    # helpers the other steps wrote
    (("!nvidia-smi\n", "%%writefile a.txt\nhello\n"), {}, {"files"}, set()),
    # a Trainer keeps the notebook's global batch (decided at run time); no Trainer, nothing to keep
    (UNSLOTH_SFT, {}, {"global_batch"}, set()),
    (UNSLOTH_SFT, {"scale_batch": True}, {"global_batch"}, set()),
    # dead code asks for nothing; a function named like a trainer is not one
    (("if False:\n    from unsloth import FastLanguageModel\n    from trl import SFTTrainer\n",), {}, {"group"},
     {"balance", "peft_shim", "lean_sync"}),
    (("from unsloth import PatchDPOTrainer\nPatchDPOTrainer()\n",), {}, set(), {"strategy"}),
])
def test_the_script_carries_what_the_notebook_needs(cells, options, wanted, not_wanted):
    got = carried(*cells, **options)
    assert wanted <= got and not (not_wanted & got), got


@pytest.mark.parametrize("load, models", [
    ("FastLanguageModel.from_pretrained('org/m')", [("org/m", 4)]),  # Unsloth loads in 4 bits by default
    ("FastLanguageModel.from_pretrained('org/m', load_in_4bit = False)", [("org/m", 16)]),
    ("FastLanguageModel.from_pretrained('org/m', load_in_4bit = False, load_in_8bit = True)", [("org/m", 8)]),
    ("FastLanguageModel.from_pretrained(model_name = NAME, load_in_4bit = FOUR)", [("org/named", 4)]),
    ("FastModel.from_pretrained('org/m', full_finetuning = True)", [("org/m", 16)]),
    ("AutoModelForCausalLM.from_pretrained('org/m')", [("org/m", 16)]),
    ("FLM.from_pretrained('org/m')", [("org/m", 4)]),  # an Unsloth loader under the notebook's own name
    ("AutoModelForCausalLM.from_pretrained('org/m', dtype = torch.float32)", [("org/m", 32)]),
    ("AutoModelForCausalLM.from_pretrained('org/m', load_in_4bit = flags.four)", [("org/m", 4)]),  # unread: smaller
])
def test_the_script_sizes_each_model_it_can_read(load, models):
    conversion = convert_notebook(make_notebook("from unsloth import FastLanguageModel as FLM\n"
                                            "NAME = 'org/named'\nFOUR = True\n", f"model = {load}\n"))
    assert list(conversion.runtime.models) == models
    assert f"nbddp_start(nbddp_fit({models!r})" in conversion.script


def test_the_report_says_what_it_found_and_what_it_cannot_size():
    report = convert_notebook(make_notebook(
        "from unsloth import FastLanguageModel\n"
        "model, tok = FastLanguageModel.from_pretrained('org/big', device_map = 'balanced')\n",
        "other = AutoModelForCausalLM.from_pretrained(choose())\n")).report
    changes, warnings = [n.text for n in report.changes], [n.text for n in report.warnings]
    assert any("model org/big (4-bit, the notebook's placement: 'balanced')" in c and "decides at run time" in c
               for c in changes), changes
    assert any("from_pretrained(choose(), ...): nbddp cannot read which model" in w for w in warnings), warnings


def test_a_splitting_placement_stays_for_split_mode():
    script = convert_notebook(make_notebook("m = AutoModelForCausalLM.from_pretrained('org/m', device_map = 'auto')\n",
                                        "n = AutoModelForCausalLM.from_pretrained('org/m')\n")).script
    assert "device_map = nbddp_device_map('auto')" in script and "device_map=nbddp_device_map())" in script


def test_each_carried_module_says_why_in_one_line():
    conversion = convert_notebook(make_notebook(*UNSLOTH_SFT))
    lines = [line for line in conversion.script.splitlines() if line.startswith("# -- ")]
    assert [line.split(":")[0][5:] for line in lines] == ["hash_seed", "recipe", "launcher", "wait", "group",
                                                          "same_random", "hooks", "split_place", "fit",
                                                          "one_writer", "files", "file_races", "agree", "stdin_fd",
                                                          "owner", "ipython_forms", "unsloth_group", "lean_sync", "peft_shim",
                                                          "global_batch", "balance", "shard_host", "shard",
                                                          "shard_load", "shard_quant", "shard_mode"]
    assert lines[6] == "# -- hooks: needed by split_place, fit, one_writer, files, agree, stdin_fd, unsloth_group, " \
                       "lean_sync, peft_shim, global_batch, balance, shard_mode"
    assert "the notebook trains with a Trainer" in lines[-6]


@pytest.mark.parametrize("notebook, most", [
    (Path(__file__).resolve().parents[1] / "notebooks" / "tiny_llama_sft.ipynb", 1427),  # (+15: os.posix_spawn's
    # and a fork's os.exec* children outside the job)
    # + 734: an Unsloth notebook that trains adapters carries the sharded mode (shard_host, shard, shard_load,
    # shard_quant, shard_mode), which its 4-bit loader loads into where the model does not fit one GPU;
    # + 147: split mode's own placement (split_place), which every script that loads a model carries
    ("Kaggle-Llama3.1_(8B)-Alpaca", 1545 + 734 + 147),
])
def test_lines_before_the_first_notebook_cell(notebook, most):
    """The default script starts with the notebook (its runtime is a file beside it); the single file (a Kaggle
    Script) carries the runtime first, cut to what the notebook needs."""
    notebook = notebook if isinstance(notebook, Path) else need_corpus(notebook)
    lines = convert_notebook(str(notebook), single_file=False).script.splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip().startswith("# %% cell "))
    assert first <= 40, f"{notebook.name}: {first} lines before the first cell"
    lines = convert_notebook(str(notebook)).script.splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip().startswith("# %% cell "))
    assert first <= most, f"{notebook.name}: {first} lines before the first cell"


def test_the_report_gives_the_batch_in_numbers_and_scale_batch_is_the_scripts_default():
    code = "args = SFTConfig(per_device_train_batch_size = 2, gradient_accumulation_steps = 4)\n"
    kept = convert_notebook(make_notebook(code))
    assert "nbddp_accumulation" not in kept.script.split("# %% cell 1")[1]  # the notebook's code as written
    assert any("2 x 4 = 8 samples per optimizer step on 1 process; 8 on 2 (2 x 2 per rank), 8 on 4 (2 x 1 per rank)"
               in n.text for n in kept.report.changes)
    one = convert_notebook(make_notebook(code.replace("= 4", "= 1")))
    assert any("2 x 1 = 2 samples per optimizer step on 1 process; 2 on 2 (1 x 1 per rank), 8 on 4 (neither "
               "gradient_accumulation_steps 1 nor per_device_train_batch_size 2 divides by 4); an accumulation or a "
               "batch that the process count divides keeps the notebook's batch" in n.text for n in one.report.changes)
    scaled = convert_notebook(make_notebook(code, "from trl import SFTTrainer\ntrainer = SFTTrainer(model=m, args=args)\n"),
                              options=Options(scale_batch=True))
    assert any("16 on 2, 32 on 4 (--scale-batch)" in n.text for n in scaled.report.changes)
    assert 'nbddp_start(batch="scale")' in scaled.script
    unknown = convert_notebook(make_notebook("args = SFTConfig(gradient_accumulation_steps = steps)\n"))
    assert any("decided at run time" in n.text for n in unknown.report.changes)


def test_a_generation_batch_that_more_processes_break_is_reported_with_what_to_set():
    """TRL's GRPO refuses a generation_batch_size that per_device_train_batch_size x N does not divide (what 1
    process accepts, 2 may not); unset, it follows the batch on any count."""
    code = "args = GRPOConfig(per_device_train_batch_size = 2, num_generations = 2, generation_batch_size = {})\n"
    broken = convert_notebook(make_notebook("from trl import GRPOConfig\n", code.format(2)))
    assert any("generation_batch_size=2 must divide by per_device_train_batch_size x the process count, or TRL stops "
               "the job: not on 4 (2 x 4 = 8) processes; leave generation_batch_size unset" in n.text  # 2: 1 x 2
               and "a multiple of 8" in n.text for n in broken.report.warnings), broken.report.warnings
    for fine in (code.format(8), code.replace(", generation_batch_size = {}", "")):
        assert not any("generation_batch_size" in n.text for n in
                       convert_notebook(make_notebook("from trl import GRPOConfig\n", fine)).report.warnings)


# ---- the inliner ----
def test_every_runtime_module_is_listed_and_shares_names_through_relative_imports_only():
    files = {p.stem for p in RUNTIME.glob("*.py")} - {"__init__"}
    assert files == set(MODULES)
    owner = {}
    for name in MODULES:
        tree = ast.parse((RUNTIME / f"{name}.py").read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1 and node.module in MODULES, f"{name}: {ast.unparse(node)}"
            elif isinstance(node, (ast.Import, ast.ImportFrom)):  # the script imports nothing the notebook must first
                roots = {alias.name.split(".")[0] for alias in node.names} if isinstance(node, ast.Import) \
                    else {node.module.split(".")[0]}
                assert roots <= set(sys.stdlib_module_names) | {"torch"}, f"{name}: {ast.unparse(node)}"
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                assert owner.setdefault(node.name, name) == name, f"{node.name} in {owner[node.name]} and {name}"
                assert node.name.lower().startswith(("nbddp", "_nbddp")), f"{name}.{node.name}: not prefixed"


def test_the_whole_runtime_inlines_into_code_without_docstrings_or_relative_imports():
    code = inline.render(inline.everything())
    tree = ast.parse(code)
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level]
    documented = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                  and ast.get_docstring(n) and len(n.body) > 1]
    assert documented == []
    assert [line[5:].split(":")[0] for line in code.splitlines() if line.startswith("# -- ")] == \
        ["hash_seed", "recipe", "launcher", "wait", "group", "same_random", "hooks", "split_place", "fit", "one_writer",
         "files", "file_races", "agree", "share",
         "stdin_fd", "owner", "ask", "ipython_forms", "unsloth_group", "checkpoint", "strategy", "lean_sync", "tiled_mlp", "peft_shim", "xformers_shim",
         "global_batch", "balance", "loop", "shard_host", "shard", "shard_load", "shard_quant", "shard_mode"]


def test_inlining_keeps_what_is_read_and_what_runs_at_import():
    code = inline.render(inline.Choice({"group": "why"}, frozenset({"nbddp_device_map"})))
    assert "def nbddp_device_map" in code and "def nbddp_start" in code and "def nbddp_teardown" in code
    assert "def nbddp_self_launch" in code and "# -- launcher: needed by group" in code  # every script launches itself
    assert "def nbddp_launch(" in code and "# -- recipe: needed by launcher" in code  # by nbddp's one recipe
    assert "subprocess" not in code and "def nbddp_shell" not in code
    code = inline.render(inline.Choice({"files": "why"}, frozenset({"nbddp_shell"})))
    assert "def nbddp_shell" in code and "NBDDP_IS_LOCAL_MAIN =" in code and "import subprocess" in code
    assert "def nbddp_write_file" not in code and "def nbddp_main_process_first" not in code
    assert code.index("# -- group: needed by") < code.index("# -- files: why") and "# -- one_writer" not in code
    code = inline.render(inline.Choice({"peft_shim": "why"}))  # runs at import: the watch line keeps its patch
    assert 'NBDDP_IMPORTS.watch("peft", _nbddp_patch_peft)' in code and "def _nbddp_patch_peft" in code
    assert "sys.meta_path.insert(0, NBDDP_IMPORTS)" in code


@pytest.mark.parametrize("cell", [
    "from unsloth import FastLanguageModel\nmodel, tok = FastLanguageModel.from_pretrained('m', fast_inference = True)\n",
    "from trl import GRPOConfig\nargs = GRPOConfig(output_dir = 'o', use_vllm = True)\n",
])
def test_a_notebook_that_asks_for_vllm_is_told_what_ddp_does_with_it(cell):
    report = convert_notebook(make_notebook(cell)).report
    assert any("vLLM under DDP" in n.text for n in report.changes), report.changes
    off = convert_notebook(make_notebook(cell.replace("True", "False"))).report
    assert not any("vLLM" in n.text for n in off.changes)


def test_the_helpers_steps_write_are_the_runtimes_declared_api():
    """Each step declares the helpers it may write (`inserts`); each is in nbddp.runtime.HELPERS, defined at the top
    level of the module HELPERS names; and every declared helper is written by some step."""
    import ast

    from nbddp.pipeline import steps, tree_steps
    from nbddp.runtime import HELPERS
    from nbddp.inline import RUNTIME

    declared = {name: type(step).__name__ for step in steps() + tree_steps() for name in step.inserts}
    assert set(declared) == set(HELPERS), set(declared) ^ set(HELPERS)
    for name, helper in HELPERS.items():
        tree = ast.parse((RUNTIME / f"{helper.module}.py").read_text(encoding="utf-8"))
        defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.ClassDef))} | {
            target.id for node in tree.body if isinstance(node, ast.Assign) for target in node.targets
            if isinstance(target, ast.Name)}
        assert name in defined, f"{name} ({declared[name]}) is not defined in runtime/{helper.module}.py"


def test_the_runtime_parts_are_kept_between_conversions_and_a_broken_copy_is_made_again(monkeypatch, tmp_path):
    """Parsing every runtime module costs about a second a conversion: their parts are kept under the user's cache
    folder, named by what they were made from; a file cut short is made again, and the runtime is the same."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    inline.load.cache_clear()
    fresh = inline.render(inline.everything())
    kept = sorted((tmp_path / "nbddp" / "runtime").glob("*.json"))
    assert len(kept) == len(MODULES), kept
    kept[0].write_text('{"requires": [')
    inline.load.cache_clear()
    assert inline.render(inline.everything()) == fresh
    assert json.loads(kept[0].read_text())["parts"]
    inline.load.cache_clear()
