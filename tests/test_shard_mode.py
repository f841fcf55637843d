"""The sharded mode in a converted script, without running one (nbddp/runtime/shard_mode.py; the run itself:
test_shard_notebook.py; the fit check's choice: test_runtime_launch.py): which scripts carry it, its share of a model
for the fit check, the line it says as it starts, and the loads it refuses before reading anything (a quantized
model, a hub id whose files are not here), each with one line that names NBDDP_MODE=split."""
from __future__ import annotations

import json
import os

import pytest

from conftest import make_notebook
from nbddp import inline
from nbddp.pipeline import convert_notebook

LOAD = "from transformers import AutoModelForCausalLM\nmodel = AutoModelForCausalLM.from_pretrained('org/model')\n"
PEFT = "from peft import LoraConfig, get_peft_model\nmodel = get_peft_model(model, LoraConfig(r = 8))\n"


@pytest.mark.parametrize("cells, carried", [
    ((LOAD, PEFT), True),  # a model that the script sizes, and peft's adapters: the fit check may choose the mode
    ((LOAD,), False),  # no adapters: the frozen base would be everything (a full fine-tune does not shard)
    ((LOAD.replace("'org/model'", "pick()"), PEFT), False),  # not sized: no fit check
    (("from unsloth import FastLanguageModel\nmodel, tok = FastLanguageModel.from_pretrained('org/m')\n", PEFT),
     False),  # Unsloth's loaders do not load sharded yet
])
def test_the_scripts_that_can_load_sharded_carry_the_mode(cells, carried):
    conversion = convert_notebook(make_notebook(*cells))
    assert ("shard_mode" in conversion.runtime.reasons) == carried
    modules = inline.closure(conversion.runtime.reasons)
    assert ({"shard_mode", "shard_load", "shard", "shard_host"} <= set(modules)) == carried
    if carried:  # it tells the fit check, at import, that this script can load the model sharded
        assert "NBDDP_SHARDABLE.update(share=nbddp_shard_share, start=nbddp_shard_start)" in conversion.script
        assert "nbddp_start(nbddp_fit([('org/model', 16)]))" in conversion.script
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
    ({"load_in_4bit": True}, "load_in_4bit asks"),
    ({"load_in_8bit": True}, "load_in_8bit asks"),
    ({"quantization_config": {"load_in_4bit": True}}, "quantization_config asks"),
    ({"_checkpoint": {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}},
     "its checkpoint is"),
])
def test_a_quantized_load_stops_with_one_line(tmp_path, shard_mode, capsys, kwargs, why):
    import transformers
    folder = _folder(tmp_path)
    if "_checkpoint" in kwargs:  # a pre-quantized checkpoint: its config says so
        config = json.loads((tmp_path / "config.json").read_text())
        (tmp_path / "config.json").write_text(json.dumps({**config, **kwargs.pop("_checkpoint")}))
    with pytest.raises(SystemExit) as stop:
        shard_mode.nbddp_from_pretrained_sharded(transformers.LlamaForCausalLM, folder, **kwargs)
    err = capsys.readouterr().err
    assert stop.value.code == 1 and err.count("\n") == 1, err
    assert err == (f"nbddp: error: LlamaForCausalLM.from_pretrained({folder!r}): {why} for a quantized model, and "
                   "sharded loading of quantized models is not built yet: NBDDP_MODE=split loads it in one process "
                   "over every GPU\n")


def test_a_hub_id_whose_files_are_not_here_stops_with_one_line(tmp_path, shard_mode, capsys):
    import transformers
    with pytest.raises(SystemExit):
        shard_mode.nbddp_from_pretrained_sharded(transformers.LlamaForCausalLM, "org/not-here",
                                                 cache_dir=str(tmp_path / "empty-cache"))
    assert "a model whose files are in the Hugging Face cache, and does not download yet: download it first (`hf " \
           "download org/not-here`), or NBDDP_MODE=split" in capsys.readouterr().err


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


def test_the_share_the_fit_check_gets(tmp_path, shard_mode, monkeypatch):
    """GiB a process (fit.nbddp_shard_gib) where the mode can load the model: 2 processes or more, 16 or 32 bits, its
    files on this machine; else None (the fit check then picks split, or none)."""
    from nbddp.runtime import fit
    folder = _folder(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert shard_mode.nbddp_shard_share([(folder, 16)], 2) == fit.nbddp_shard_gib(config, 16, 2)
    assert shard_mode.nbddp_shard_share([(folder, 32)], 4) == fit.nbddp_shard_gib(config, 32, 4)
    assert shard_mode.nbddp_shard_share([(folder, 16)], 1) is None
    assert shard_mode.nbddp_shard_share([(folder, 4)], 2) is None  # quantized: not built
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
