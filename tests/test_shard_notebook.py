"""`python train_ddp.py` of a converted notebook in the sharded mode (nbddp/runtime/fit.py, shard_mode.py,
docs/sharded.md), on CPU with gloo: the notebook loads a tiny random-weight Llama that the test saved with
`save_pretrained` (3 layers, fp32) by its own `AutoModelForCausalLM.from_pretrained`, adds LoRA with peft's
`get_peft_model`, trains 4 steps with transformers' Trainer (gradient checkpointing) and saves the adapter.

Run with NBDDP_MODE=shard and NBDDP_NPROC=2, the script launches its 2 ranks itself; the reference is the same script
run as one plain process (NBDDP_NPROC=1, NBDDP_MODE unset: DDP mode's one process, the model loaded whole by
transformers' own from_pretrained), both jobs at once. Checked: the start-up line names the sharded mode, once;
the notebook's from_pretrained loaded the model sharded (its line); each rank held the layers' frozen parameters
empty and its own slice of them, half of each layer's bytes; the Trainer's DDP wrap (of peft's model, which names
the parameters otherwise) left every sharded parameter out; the per-step losses equal the plain process's; the
adapter was saved once, by rank 0, equal to the plain process's."""
from __future__ import annotations

import json
import shutil
import sys

import pytest

from conftest import make_notebook
from e2e import SCRIPT, assert_clean_exit, run_jobs

pytestmark = pytest.mark.ddp
LAYERS, STEPS = 3, 4  # test_shard_load.save_checkpoint's tiny Llama: 3 layers, vocabulary 96
PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

CELLS = (
    "import json, os\nimport torch\nfrom transformers import AutoModelForCausalLM\n\n"
    "model = AutoModelForCausalLM.from_pretrained('base', dtype = torch.float32)\n"
    "shards = globals().get('NBDDP_SHARDED', [])  # the runtime's record of the sharded load (none: loaded whole)\n"
    "held = {'values': {n: p.numel() for n, p in model.named_parameters()},\n"
    "        'slices': [b.shard.numel() for s in shards for b in s.blocks],\n"
    "        'layer_bytes': [b.size for s in shards for b in s.blocks]}\n"
    "with open(f\"held-rank{os.environ.get('RANK', '0')}.json\", 'w') as fh:\n    json.dump(held, fh)\n",
    "from peft import LoraConfig, get_peft_model\n\ntorch.manual_seed(0)\n"
    "model = get_peft_model(model, LoraConfig(r = 4, lora_alpha = 8, lora_dropout = 0.0,\n"
    f"                                          target_modules = {PROJECTIONS!r}))\n",
    "from transformers import Trainer, TrainingArguments\n\n"
    "rows = torch.randint(0, 96, (16, 16), generator = torch.Generator().manual_seed(2))\n"
    "data = [{'input_ids': r, 'labels': r, 'attention_mask': torch.ones_like(r)} for r in rows]\n"
    f"args = TrainingArguments(output_dir = 'out', per_device_train_batch_size = 2, max_steps = {STEPS},\n"
    "                         learning_rate = 1e-2, logging_steps = 1, save_strategy = 'no', report_to = 'none',\n"
    "                         seed = 0, disable_tqdm = True, gradient_checkpointing = True,\n"
    "                         gradient_checkpointing_kwargs = {'use_reentrant': False})\n"
    "trainer = Trainer(model = model, args = args, train_dataset = data)\ntrainer.train()\n",
    "with open('trained.json', 'w') as fh:\n"
    "    json.dump({'losses': [e['loss'] for e in trainer.state.log_history if 'loss' in e],\n"
    "               'ddp_ignores': sorted(getattr(trainer.model_wrapped, 'parameters_to_ignore', ()))}, fh)\n"
    "model.save_pretrained('lora_model')\n",
    # after training's end rank 0 runs alone: its forward passes gather each layer without the other rank
    "model.eval()\nwith torch.no_grad():\n    logits = model(input_ids = rows[:2]).logits\n"
    "    made = model.generate(input_ids = rows[:1, :4], max_new_tokens = 3, do_sample = False)\n"
    "with open('alone.json', 'w') as fh:\n"
    "    json.dump({'logits': logits.flatten()[:64].tolist(), 'made': made.shape[1]}, fh)\n",
)


def sharded_and_plain(conversion, tmp_path):
    """The converted script run twice at once beside a copy of tmp_path/base, as `NBDDP_MODE=shard NBDDP_NPROC=2
    python train_ddp.py` and as one plain process: both jobs, each ended cleanly."""
    runs = {}
    for name, env in (("sharded", {"NBDDP_MODE": "shard", "NBDDP_NPROC": "2"}), ("plain", {"NBDDP_NPROC": "1"})):
        cwd = tmp_path / name
        shutil.copytree(tmp_path / "base", cwd / "base")
        (cwd / SCRIPT).write_text(conversion.script, encoding="utf-8")
        runs[name] = ([sys.executable, SCRIPT], cwd, env)
    jobs = run_jobs(runs.values(), timeout=240)
    for job in jobs:
        assert_clean_exit(job)
    return jobs


def test_a_converted_notebook_trains_sharded_as_one_plain_process_trains_it(tmp_path):
    from safetensors.torch import load_file

    from nbddp.pipeline import convert_notebook
    from test_shard_load import save_checkpoint
    conversion = convert_notebook(make_notebook(*CELLS))
    assert "shard_mode" in conversion.runtime.reasons  # a model load and peft's adapters: the script can shard
    save_checkpoint(str(tmp_path / "base"))
    sharded, plain = sharded_and_plain(conversion, tmp_path)

    said = [line for line in sharded.stdout.splitlines() if line.startswith("nbddp: NBDDP_MODE=shard: ")]
    assert len(said) == 1 and "2 processes, each holding 1/2 of the frozen layers" in said[0], sharded.explain()
    assert "a process with its layers sharded over 2" in said[0]  # with the model's numbers, from its config
    assert sharded.count("nbddp: 0 GPUs: running as 2 processes") == 1, sharded.explain()
    assert sharded.count(f"LlamaForCausalLM.from_pretrained('base'): loaded sharded over 2 processes, layer by layer: "
                         f"its {LAYERS} layers' frozen weights") == 1, sharded.explain()
    assert "not taken by the sharded load" not in sharded.stdout, sharded.explain()  # the Auto class's own keywords
    assert "sharded" not in plain.stdout and "NBDDP_MODE" not in plain.stdout, plain.explain()

    # each rank held the layers' frozen parameters empty and half of each layer's bytes as its own slice
    whole = json.loads((plain.cwd / "held-rank0.json").read_text())
    assert whole["slices"] == [] and all(whole["values"].values())
    layer_bytes = sum(4 * n for name, n in whole["values"].items() if ".layers." in name)  # fp32
    for rank in range(2):
        held = json.loads((sharded.cwd / f"held-rank{rank}.json").read_text())
        assert held["values"].keys() == whole["values"].keys()
        for name, n in held["values"].items():
            assert n == (0 if ".layers." in name else whole["values"][name]), (rank, name, n)
        assert len(held["slices"]) == LAYERS and [2 * s for s in held["slices"]] == held["layer_bytes"], held
        assert layer_bytes <= sum(held["layer_bytes"]) <= layer_bytes + LAYERS * 9 * 2 * 256  # aligned, padded

    # the Trainer's DDP wrap (of peft's model) left out every sharded parameter, by the names it holds them under
    trained, reference = (json.loads((job.cwd / "trained.json").read_text()) for job in (sharded, plain))
    ignored = trained["ddp_ignores"]
    assert len(ignored) == LAYERS * 9 and all(n.startswith("base_model.model.model.layers.") for n in ignored), ignored
    assert reference["ddp_ignores"] == []  # one process: no DDP

    assert len(trained["losses"]) == len(reference["losses"]) == STEPS, (trained, reference)
    for got, want in zip(trained["losses"], reference["losses"]):
        assert got == pytest.approx(want, rel=1e-5), (trained["losses"], reference["losses"])

    end = [line for line in sharded.stdout.splitlines() if line.startswith("nbddp: done (status 0) in ")]
    assert len(end) == 1 and "saved by rank 0, once: lora_model (save_pretrained)" in end[0], sharded.explain()
    adapter, adapter_plain = (load_file(job.cwd / "lora_model" / "adapter_model.safetensors") for job in (sharded, plain))
    assert sorted(adapter) == sorted(adapter_plain) and len(adapter) == LAYERS * len(PROJECTIONS) * 2
    for key, value in adapter.items():  # Adam's steps make last-bit gradient differences visible: by its norm
        assert (value - adapter_plain[key]).norm() <= 1e-3 * adapter_plain[key].norm(), key

    # rank 0 alone, after training: a forward pass and a generation over the sharded layers, as the plain process's
    alone, alone_plain = (json.loads((job.cwd / "alone.json").read_text()) for job in (sharded, plain))
    assert alone["made"] == alone_plain["made"] == 7
    assert alone["logits"] == pytest.approx(alone_plain["logits"], rel=1e-3, abs=1e-4)
    assert "copies from shared host memory" in sharded.stdout, sharded.explain()


TRL_CELLS = (
    "import json\nimport torch\nfrom datasets import Dataset\nfrom peft import LoraConfig\n"
    "from trl import SFTConfig, SFTTrainer\n\n"
    "rows = Dataset.from_dict({'text': [f'### Instruction: count to {i}. ### Response: ' + ' '.join(map(str, range(i)))\n"
    "                                   for i in range(16)]})\n"
    f"args = SFTConfig(output_dir = 'out', per_device_train_batch_size = 2, max_steps = {STEPS}, max_length = 32,\n"
    "                 learning_rate = 1e-2, logging_steps = 1, save_strategy = 'no', report_to = 'none', seed = 0,\n"
    "                 disable_tqdm = True, bf16 = False, model_init_kwargs = {'dtype': torch.float32})\n"
    "trainer = SFTTrainer(model = 'base', args = args, train_dataset = rows,\n"
    f"                     peft_config = LoraConfig(r = 4, lora_alpha = 8, target_modules = {PROJECTIONS!r}))\n"
    "trainer.train()\n",
    "shards = globals().get('NBDDP_SHARDED', [])\n"
    "with open('trained.json', 'w') as fh:\n"
    "    json.dump({'losses': [e['loss'] for e in trainer.state.log_history if 'loss' in e],\n"
    "               'sharded_layers': sum(len(s.blocks) for s in shards)}, fh)\n",
)


def test_a_model_trls_trainer_loads_from_its_id_loads_sharded_and_trains_as_one_plain_process_trains_it(tmp_path):
    """`SFTTrainer(model='base', peft_config=...)`: TRL's own from_pretrained of the id loads the model sharded (the
    converter sizes the trainer's id for the fit check and carries the mode); the losses equal one plain process's."""
    from nbddp.pipeline import convert_notebook
    from tinymodels import save_tiny_llama
    conversion = convert_notebook(make_notebook(*TRL_CELLS))
    assert "shard_mode" in conversion.runtime.reasons and "nbddp_fit([('base', 32)])" in conversion.script
    save_tiny_llama(tmp_path / "base", num_hidden_layers=LAYERS, tie_word_embeddings=False)
    sharded, plain = sharded_and_plain(conversion, tmp_path)
    assert sharded.count("LlamaForCausalLM.from_pretrained('base'): loaded sharded over 2 processes") == 1, \
        sharded.explain()
    trained, reference = (json.loads((job.cwd / "trained.json").read_text()) for job in (sharded, plain))
    assert trained["sharded_layers"] == LAYERS and reference["sharded_layers"] == 0
    assert len(trained["losses"]) == len(reference["losses"]) == STEPS, (trained, reference)
    for got, want in zip(trained["losses"], reference["losses"]):
        assert got == pytest.approx(want, rel=1e-5), (trained["losses"], reference["losses"])
