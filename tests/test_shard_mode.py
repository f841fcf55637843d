"""The sharded mode in a converted script, without running one (nbddp/runtime/shard_mode.py; the run itself:
test_shard_notebook.py; the fit check's choice: test_runtime_launch.py): which scripts carry it, its share of a model
for the fit check, the line it says as it starts, and the loads it refuses before reading anything (a quantized
model, a hub id whose files are not here), each with one line that names NBDDP_MODE=split."""
from __future__ import annotations

import json
import os
import pathlib

import pytest

from conftest import make_notebook
from nbddp import inline
from nbddp.pipeline import convert_notebook

LOAD = "from transformers import AutoModelForCausalLM\nmodel = AutoModelForCausalLM.from_pretrained('org/model')\n"
PEFT = "from peft import LoraConfig, get_peft_model\nmodel = get_peft_model(model, LoraConfig(r = 8))\n"


UNSLOTH = ("from unsloth import FastLanguageModel\n"
           "model, tok = FastLanguageModel.from_pretrained('org/m', load_in_4bit = True)\n")
UNSLOTH_LORA = "model = FastLanguageModel.get_peft_model(model, r = 16, use_gradient_checkpointing = 'unsloth')\n"
TRL = ("import torch\nfrom trl import SFTTrainer as SFT, SFTConfig\nfrom peft import LoraConfig\n"
       "from transformers import BitsAndBytesConfig\n")


@pytest.mark.parametrize("cells, carried, fit", [
    ((LOAD, PEFT), True, "nbddp_fit([('org/model', 16)])"),  # sized, peft's adapters: the fit check may choose it
    ((LOAD,), False, None),  # no adapters: the frozen base would be everything (a full fine-tune does not shard)
    ((LOAD.replace("'org/model'", "pick()"), PEFT), False, None),  # not sized: no fit check
    ((UNSLOTH, UNSLOTH_LORA), True, "nbddp_fit([('org/m', 4)])"),  # Unsloth's 4-bit loader and its adapters
    ((UNSLOTH.replace(", load_in_4bit = True", ""), PEFT), True, "nbddp_fit([('org/m', 4)])"),  # Unsloth's default
    ((UNSLOTH,), False, None),  # Unsloth without adapters (a full fine-tune): not sharded
    # by what the calls are, not their names: an alias, through a function, a loader under another name
    ((LOAD, "from peft import get_peft_model as wrap, LoraConfig\ndef lora(m):\n    return wrap(m, LoraConfig())\n",
      "model = lora(model)\n"), True, "nbddp_fit([('org/model', 16)])"),
    ((UNSLOTH, "FLM = FastLanguageModel\nmodel = FLM.get_peft_model(model, r = 8)\n"), True,
     "nbddp_fit([('org/m', 4)])"),
    ((UNSLOTH, "def get_peft_model(m):\n    return m.eval()\nmodel = get_peft_model(model)\n"), False, None),  # its own
    ((LOAD, "import peft\n"), False, None),  # peft imported, no adapters made: a full fine-tune
    ((UNSLOTH.replace("True", "True, fast_inference = True"), UNSLOTH_LORA), False, None),  # vLLM loads it whole
    # an id TRL's trainer loads (float32 unless its configuration or quantization says otherwise): alias, over cells
    ((TRL, "trainer = SFT(model = 'org/t', args = SFTConfig('o'), train_dataset = ds, peft_config = LoraConfig())\n"),
     True, "nbddp_fit([('org/t', 32)])"),
    ((TRL, "name = 'org/t'\ncfg = SFTConfig('o', model_init_kwargs = {'dtype': torch.bfloat16})\n",
      "trainer = SFT(name, args = cfg, train_dataset = ds, peft_config = LoraConfig())\n"), True,
     "nbddp_fit([('org/t', 16)])"),
    ((TRL, "trainer = SFT(model = 'org/t', train_dataset = ds, peft_config = LoraConfig(),\n"
           "             quantization_config = BitsAndBytesConfig(load_in_4bit = True))\n"), True, "nbddp_fit([('org/t', 4)])"),
    ((TRL, "trainer = SFT(model = model, train_dataset = ds, peft_config = LoraConfig())\n"), False, None),  # an object
])
def test_the_scripts_that_can_load_sharded_carry_the_mode(cells, carried, fit):
    conversion = convert_notebook(make_notebook(*cells))
    assert ("shard_mode" in conversion.runtime.reasons) == carried
    modules = inline.closure(conversion.runtime.reasons)
    assert ({"shard_mode", "shard_quant", "shard_load", "shard", "shard_host"} <= set(modules)) == carried
    if carried:  # it tells the fit check, at import, that this script can load the model sharded
        assert "NBDDP_SHARDABLE.update(share=nbddp_shard_share, start=nbddp_shard_start)" in conversion.script
        assert f"nbddp_start({fit}" in conversion.script
    said = [n.text for n in conversion.report.changes if n.text.startswith("model ")]  # the report says the modes
    assert [("its frozen layers sharded over the processes" in text) for text in said] in ([carried], []), said
    assert said or not carried


@pytest.fixture
def shard_mode(monkeypatch, capsys):
    from nbddp.runtime import fit, hooks, shard_mode
    monkeypatch.setattr(fit, "NBDDP_IS_MAIN", True)
    monkeypatch.setattr(hooks, "NBDDP_IS_MAIN", True)
    hooks._NBDDP_SAID.clear()
    return shard_mode


def _folder(tmp_path, **config):
    """A model folder with its config alone: every refusal below comes before a tensor is read."""
    import transformers
    transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             vocab_size=96, **config).save_pretrained(tmp_path)
    return str(tmp_path)


@pytest.mark.parametrize("kwargs, why", [
    ({"load_in_8bit": True}, "it asks for 8-bit bitsandbytes"),
    ({"quantization_config": {"load_in_8bit": True}}, "it asks for 8-bit bitsandbytes"),
    ({"_checkpoint": {"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}}},
     "its checkpoint is 8-bit bitsandbytes"),
    ({"_checkpoint": {"quantization_config": {"quant_method": "gptq", "bits": 4}}}, "its checkpoint is gptq "
     "quantization"),
    ({"_checkpoint": {"quantization_config": {"quant_method": "bitsandbytes", "load_in_8bit": True}},
      "load_in_4bit": True}, "its checkpoint is 8-bit bitsandbytes"),  # the checkpoint's own wins
])
def test_a_quantized_load_other_than_4bit_stops_with_one_line(tmp_path, shard_mode, capsys, kwargs, why):
    import transformers
    folder = _folder(tmp_path)
    if "_checkpoint" in kwargs:  # a pre-quantized checkpoint: its config says so
        config = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**config, **kwargs.pop("_checkpoint")}))
    with pytest.raises(SystemExit) as stop:
        shard_mode.nbddp_from_pretrained_sharded(transformers.LlamaForCausalLM, folder, dtype="float16", **kwargs)
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("nbddp:")]
    assert stop.value.code == 1 and said == [
        f"nbddp: error: LlamaForCausalLM.from_pretrained({folder!r}): {why}, which the sharded mode does not load (it "
        "loads 16 and 32 bits and bitsandbytes 4-bit): NBDDP_MODE=split loads it in one process over every GPU"]


@pytest.mark.parametrize("asked, stored, refused", [
    (None, None, False),
    ({"load_in_4bit": True}, None, False),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, None, False),
    (None, {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True}, False),
    ({"load_in_4bit": True}, {"quant_method": "bitsandbytes", "load_in_4bit": True}, False),
    ({"load_in_8bit": True}, None, True),
    ({"quant_method": "bitsandbytes"}, None, True),  # neither 4 nor 8 bits named
    (None, {"quant_method": "awq", "bits": 4}, True),
    ({"load_in_4bit": True}, {"quant_method": "fp8"}, True),  # the checkpoint's own method wins
])
def test_which_quantizations_the_mode_loads(asked, stored, refused):
    from nbddp.runtime.shard_quant import nbddp_quant_refused
    assert bool(nbddp_quant_refused(asked, stored)) == refused


def test_a_4bit_config_object_is_read_as_its_dict():
    """transformers' own BitsAndBytesConfig (what Unsloth passes), 4-bit and 8-bit."""
    import transformers
    from nbddp.runtime.shard_quant import nbddp_quant_asked, nbddp_quant_refused
    four = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4")
    assert nbddp_quant_refused(nbddp_quant_asked({"quantization_config": four}), None) is None
    eight = transformers.BitsAndBytesConfig(load_in_8bit=True)
    assert "8-bit" in nbddp_quant_refused(nbddp_quant_asked({"quantization_config": eight}), None)
    assert nbddp_quant_asked({"load_in_4bit": True}) == {"quant_method": "bitsandbytes", "load_in_4bit": True}
    assert nbddp_quant_asked({"load_in_4bit": False}) is None


def test_a_4bit_load_without_bitsandbytes_stops_with_one_line(tmp_path, shard_mode, capsys):
    pytest.importorskip("transformers")
    try:
        import bitsandbytes  # noqa: F401
        pytest.skip("bitsandbytes is installed here: the load goes on (the GPU test loads it)")
    except ImportError:
        pass
    import transformers
    folder = _folder(tmp_path)
    with pytest.raises(SystemExit):
        shard_mode.nbddp_from_pretrained_sharded(transformers.LlamaForCausalLM, folder, dtype="float16",
                                                 load_in_4bit=True)
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("nbddp:")]
    assert len(said) == 1 and "requires bitsandbytes" in said[0], said


def test_the_state_of_a_prequantized_weight_is_found_by_its_key():
    """A pre-quantized checkpoint (bitsandbytes' serialization, as Unsloth's -bnb-4bit repos hold it): each 4-bit
    weight's packed bytes under its own key, its state under that key and a suffix; another weight's, or a key that
    only starts alike (q_proj.weight2), is not its state."""
    from nbddp.runtime.shard_quant import nbddp_quant_stat_keys
    weight = "model.layers.0.self_attn.q_proj.weight"
    stats = [f"{weight}.absmax", f"{weight}.quant_map", f"{weight}.nested_absmax", f"{weight}.nested_quant_map",
             f"{weight}.quant_state.bitsandbytes__nf4"]
    keys = [weight, *stats, "model.layers.0.self_attn.q_proj.weight2.absmax", "model.layers.1.self_attn.q_proj."
            "weight.absmax", "model.layers.0.self_attn.k_proj.weight.absmax", "model.layers.0.input_layernorm.weight",
            f"{weight}.something_else"]
    assert nbddp_quant_stat_keys(reversed(keys), weight) == stats
    fp4 = "model.layers.3.mlp.down_proj.weight"
    assert nbddp_quant_stat_keys([fp4, f"{fp4}.absmax", f"{fp4}.quant_map", f"{fp4}.quant_state.bitsandbytes__fp4"],
                                 fp4) == [f"{fp4}.absmax", f"{fp4}.quant_map", f"{fp4}.quant_state.bitsandbytes__fp4"]
    assert nbddp_quant_stat_keys(keys, "model.embed_tokens.weight") == []


def test_a_hub_id_whose_files_are_not_here_and_cannot_be_downloaded_stops_with_one_line(tmp_path, shard_mode, capsys,
                                                                                        monkeypatch):
    import transformers
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SystemExit):
        shard_mode.nbddp_from_pretrained_sharded(transformers.LlamaForCausalLM, "org/not-here",
                                                 cache_dir=str(tmp_path / "empty-cache"))
    assert "a model whose files are in the Hugging Face cache or can be downloaded (HF_HUB_OFFLINE is set): download " \
           "it first (`hf download org/not-here`), or NBDDP_MODE=split" in capsys.readouterr().err


@pytest.mark.parametrize("local_main", [True, False])
def test_the_first_rank_of_a_machine_downloads_the_weights_and_the_others_wait_for_it(tmp_path, shard_mode, monkeypatch,
                                                                                     local_main):
    import huggingface_hub
    done = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda model, **kwargs: done.append(
        ("fetch", model, kwargs)) or str(tmp_path))
    monkeypatch.setattr(shard_mode, "nbddp_barrier", lambda what: done.append(("wait", what)))
    monkeypatch.setattr(shard_mode, "NBDDP_IS_LOCAL_MAIN", local_main)
    assert shard_mode.nbddp_download("org/m", revision="r", token="t") == str(tmp_path)
    fetched = ("fetch", "org/m", {"revision": "r", "cache_dir": None, "token": "t",
                                  "allow_patterns": ["*.safetensors", "*.json"]})
    assert done == ([fetched, ("wait", "download")] if local_main else [("wait", "download"), fetched])


def test_a_hub_id_counts_for_the_fit_check_where_it_can_be_downloaded(tmp_path, shard_mode, monkeypatch):
    from nbddp.runtime import fit
    config = json.loads((pathlib.Path(_folder(tmp_path)) / "config.json").read_text())
    monkeypatch.setattr(shard_mode, "_nbddp_config", lambda model: config)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert shard_mode.nbddp_shard_share([("org/not-cached", 16)], 2) == fit.nbddp_shard_gib(config, 16, 2)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert shard_mode.nbddp_shard_share([("org/not-cached", 16)], 2) is None


def test_the_weights_are_found_in_a_folder_or_in_the_hub_cache(tmp_path):
    from nbddp.runtime.shard_mode import nbddp_weights_folder
    cache = tmp_path / "hub"
    snapshot = cache / "models--org--m" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (cache / "models--org--m" / "refs").mkdir()
    (cache / "models--org--m" / "refs" / "main").write_text("abc123")
    assert nbddp_weights_folder("org/m", cache_dir=str(cache)) is None  # the config alone, say: not the weights
    (snapshot / "model.safetensors").write_bytes(b"")
    assert nbddp_weights_folder("org/m", cache_dir=str(cache)) == str(snapshot)
    assert nbddp_weights_folder(str(snapshot)) == str(snapshot)  # a folder is itself
    assert nbddp_weights_folder("org/other", cache_dir=str(cache)) is None


def test_the_dtype_is_read_as_from_pretrained_reads_it(tmp_path, shard_mode):
    import torch
    import transformers
    config = transformers.AutoConfig.from_pretrained(_folder(tmp_path, dtype="bfloat16"))
    assert shard_mode.nbddp_shard_dtype(None, config) is torch.bfloat16  # "auto", the default: the config's
    assert shard_mode.nbddp_shard_dtype("auto", config) is torch.bfloat16
    assert shard_mode.nbddp_shard_dtype("float16", config) is torch.float16
    assert shard_mode.nbddp_shard_dtype(torch.float32, config) is torch.float32
    config.dtype = None
    assert shard_mode.nbddp_shard_dtype(None, config) is None  # none in the config: as saved


def test_the_keywords_the_sharded_load_takes_as_from_pretrained_takes_them(shard_mode):
    import transformers
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4)
    kwargs = {"_from_auto": True, "_commit_hash": "abc", "_from_pipeline": "text-generation", "device_map": "auto",
              "load_in_4bit": True, "rms_norm_eps": 0.5, "my_option": 1}  # the first three: the Auto classes pass them
    assert shard_mode.nbddp_config_keywords(config, kwargs) == ["my_option"]
    assert config.rms_norm_eps == 0.5  # a keyword of the config's sets it


def test_the_share_the_fit_check_gets(tmp_path, shard_mode, monkeypatch):
    """GiB a process (fit.nbddp_shard_gib) where the mode can load the model: 2 processes or more, 16 or 32 bits, its
    files on this machine; else None (the fit check then picks split, or none)."""
    from nbddp.runtime import fit
    folder = _folder(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert shard_mode.nbddp_shard_share([(folder, 16)], 2) == fit.nbddp_shard_gib(config, 16, 2)
    assert shard_mode.nbddp_shard_share([(folder, 32)], 4) == fit.nbddp_shard_gib(config, 32, 4)
    assert shard_mode.nbddp_shard_share([(folder, 16)], 1) is None
    assert shard_mode.nbddp_shard_share([(folder, 4)], 2) == fit.nbddp_shard_gib(config, 4, 2)  # bitsandbytes 4-bit
    assert shard_mode.nbddp_shard_share([(folder, 8)], 2) is None  # 8-bit: not loaded sharded
    assert shard_mode.nbddp_shard_share([(folder, 16), (str(tmp_path / "elsewhere"), 16)], 2) is None


@pytest.fixture
def start(shard_mode, monkeypatch):
    """nbddp_shard_start with its patches recorded, not made (they would patch this process's transformers)."""
    turned_on = []
    monkeypatch.setattr(shard_mode, "nbddp_shard_mode_on", lambda: turned_on.append(True))
    monkeypatch.setattr(shard_mode, "NBDDP_WORLD_SIZE", 2)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "ACCELERATE_USE_CPU", "NBDDP_FIT_SAID"):
        monkeypatch.setenv(name, "")  # restored at the end, whatever the start sets
        monkeypatch.delenv(name)
    monkeypatch.setenv("NBDDP_NPROC", "2")
    return turned_on


def test_the_start_says_the_mode_once_a_job(tmp_path, shard_mode, start, monkeypatch, capsys):
    from nbddp.runtime import hooks
    folder = _folder(tmp_path)
    models = [(folder, 16)]
    share = shard_mode.nbddp_shard_share(models, 2)
    # chosen by the fit check (its numbers), in the process that launches the ranks
    assert shard_mode.nbddp_shard_start(models, "the model needs ~9.0 GiB on one GPU, 8.0/8.0 GiB free", share) == \
        "shard"
    assert capsys.readouterr().out == (
        f"nbddp: the model needs ~9.0 GiB on one GPU, 8.0/8.0 GiB free, ~{share:.1f} GiB a process with its layers "
        "sharded over 2: 2 processes, each holding 1/2 of the frozen layers (each layer gathered whole as it runs), "
        "the adapters data-parallel (NBDDP_MODE=split: one process, the model split over the GPUs)\n")
    assert start == [True] and os.environ["NBDDP_FIT_SAID"] == str(os.getpid())
    # its ranks (their parent: that process) get NBDDP_MODE=shard: turned on, said no more
    hooks._NBDDP_SAID.clear()
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(shard_mode.os, "getppid", os.getpid)
    assert shard_mode.nbddp_shard_start(models) == "shard" and start == [True, True]
    assert capsys.readouterr().out == ""
    # NBDDP_MODE=shard under a launcher of the user's: said, with the model's numbers
    monkeypatch.delenv("NBDDP_FIT_SAID")
    assert shard_mode.nbddp_shard_start(models) == "shard"
    assert capsys.readouterr().out == (
        f"nbddp: NBDDP_MODE=shard: the model needs ~1.5 GiB in one process, ~{share:.1f} GiB a process with its "
        "layers sharded over 2: 2 processes, each holding 1/2 of the frozen layers (each layer gathered whole as it "
        "runs), the adapters data-parallel\n")


def test_the_start_stops_a_job_of_one_process(tmp_path, shard_mode, start, monkeypatch, capsys):
    monkeypatch.setenv("NBDDP_NPROC", "1")
    with pytest.raises(SystemExit) as stop:
        shard_mode.nbddp_shard_start([(_folder(tmp_path), 16)])
    assert stop.value.code == 1 and capsys.readouterr().err == (
        "nbddp: error: NBDDP_MODE=shard shards the layers over 2 processes or more, this job has 1: NBDDP_NPROC=2 "
        "(or torchrun --nproc_per_node=2), or NBDDP_MODE=split\n")
    assert start == []


def test_a_causal_lm_is_known_by_its_class_not_its_name():
    import transformers

    from nbddp.runtime import shard_mode

    class Mine(transformers.LlamaForCausalLM):  # a notebook's own subclass: a causal LM
        pass

    class NotOneForCausalLM(transformers.LlamaModel):  # the name says so, the class does not
        pass

    assert shard_mode._nbddp_causal_lm(Mine) and shard_mode._nbddp_causal_lm(transformers.LlamaForCausalLM)
    assert not shard_mode._nbddp_causal_lm(NotOneForCausalLM)


def test_the_fit_check_chooses_the_sharded_mode_for_a_4bit_8b_model(tmp_path, shard_mode):
    """Llama-3.1-8B in bitsandbytes 4-bit (the Unsloth notebooks' load_in_4bit=True) over 2 processes: its layers'
    packed bytes (3.25 GiB) halved, two layers whole, the constants (1/32 of the packed bytes) and the 16-bit
    embeddings and head (1.96 GiB) whole, the adapters and 1.5 GiB: ~6.0 GiB a process, where one GPU needs ~7.7.
    At 6.5 GiB free per GPU the fit check picks the sharded mode, at 8 DDP, at 6 split mode."""
    import transformers
    from nbddp.runtime import fit
    transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                             num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    share = shard_mode.nbddp_shard_share([(str(tmp_path), 4)], 2)
    layers = 32 * 4096 * (2 * 4096 + 2 * 1024 + 3 * 14336) / 2 / 2 ** 30
    outside = 128256 * 4096 * 2 * 2 / 2 ** 30
    adapters = 16 * 32 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336)) * 16 / 2 ** 30
    assert layers == pytest.approx(3.25) and outside == pytest.approx(1.957, abs=1e-3)
    assert share == pytest.approx(layers / 2 + 2 * layers / 32 + layers / 32 + outside + adapters + 1.5)
    assert share == pytest.approx(6.01, abs=0.01)
    need = fit.nbddp_weight_gib(config, 4) * fit.NBDDP_ALLOWANCE[0] + fit.NBDDP_ALLOWANCE[1]
    assert need == pytest.approx(7.75, abs=0.01)
    assert [fit.nbddp_plan(need, [gib, gib], share) for gib in (8, 6.5, 6)] == ["ddp", "shard", "split"]
    assert shard_mode.nbddp_shard_share([(str(tmp_path), 8)], 2) is None  # 8-bit: split at 6.5


GIB = 2 ** 30


@pytest.mark.parametrize("frozen, one_machine, available, transport, why", [
    (10 * GIB, True, 30 * GIB, "host", None),  # one copy of the frozen layers, with room to spare
    (10 * GIB, True, None, "host", None),  # a machine that cannot say: as before
    (10 * GIB, True, 14 * GIB, "collective", "the machine has 14.0 GiB of memory free, one copy of the frozen layers "
                                             "takes 10.0"),  # Kaggle's 31 GB with a 14B model in fp16: no room
    (1 * GIB, False, 30 * GIB, "collective", "the ranks are on several machines"),
])
def test_the_gathers_copy_from_host_memory_where_one_machine_holds_the_frozen_layers(frozen, one_machine, available,
                                                                                       transport, why):
    from nbddp.runtime.shard_host import nbddp_host_transport
    assert nbddp_host_transport(frozen, one_machine, available) == (transport, why)


def test_rank_0_chooses_the_transport_for_every_rank_from_the_configs_frozen_layers(shard_mode, monkeypatch):
    import torch.distributed as dist
    import transformers
    config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
    sent = []
    monkeypatch.setattr(dist, "broadcast_object_list", lambda objects, src: sent.append((list(objects), src)))
    monkeypatch.setattr(shard_mode, "nbddp_host_available", lambda: 17 * GIB)
    assert shard_mode.nbddp_shard_transport(config, 4) == ("host", None)  # 4-bit: 3.25 GiB of layers
    transport, why = shard_mode.nbddp_shard_transport(config, 16)  # fp16: 13 GiB, 17 free
    assert transport == "collective" and "one copy of the frozen layers takes 13.0" in why
    assert [src for _, src in sent] == [0, 0]  # rank 0's choice, sent to every rank
