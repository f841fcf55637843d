"""A model loaded straight into the sharded mode (nbddp/runtime/shard_load.py, docs/sharded.md): a tiny random-weight Llama
saved by `save_pretrained` and loaded on 2 gloo ranks, each decoder layer read from the checkpoint in its own
`build` step and sharded at once. Logits and loss equal the whole model's loaded by `from_pretrained`, bit for bit;
each layer, gathered, holds the checkpoint's tensors; each layer's step read that layer's tensors alone, the modules
outside the layers none of them. In fp32, bf16 (tied embeddings, the rotary frequencies computed again) and fp16
(an index over several files), and with peft's adapters added on the meta model (new, initialized as peft does:
B zero), and a tiny Gemma 3 (its embedding's scale a buffer the checkpoint does not hold, made by a module whose
class takes no config). A load that reads one layer from another layer's keys fails all three checks.

This file is also the case that torchrun runs on each rank (`python test_shard_load.py FOLDER`): the test's own
process imports no transformers."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ddp
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS, VOCAB = 3, 96


def save_checkpoint(folder, dtype="float32", tied=False, shard=None):
    """The tiny Llama (random weights, random norms) saved in `dtype` (in files of at most `shard` where given)."""
    import torch
    import transformers
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                      max_position_embeddings=64, tie_word_embeddings=tied)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        for key, param in model.named_parameters():
            if key.endswith("norm.weight"):
                param.copy_(1 + 0.1 * torch.randn_like(param))
    model.to(getattr(torch, dtype)).save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))


def save_gemma3(folder):
    """A tiny Gemma 3 (random weights): its embedding's scale is a buffer the checkpoint does not hold, made by a
    module whose class takes no config."""
    import torch
    import transformers
    config = transformers.Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                           vocab_size=VOCAB, max_position_embeddings=64, sliding_window=8)
    torch.manual_seed(1)
    transformers.Gemma3ForCausalLM(config).save_pretrained(folder)


def save_checkpoints(root):
    """The tiny Llama saved in each dtype under `root`, and the tiny Gemma 3 in float32."""
    for name, tied, shard in (("float32", False, None), ("bfloat16", True, None), ("float16", False, "40KB")):
        save_checkpoint(os.path.join(root, name), name, tied, shard)
    save_gemma3(os.path.join(root, "gemma3"))


def test_a_checkpoint_loads_layer_by_layer_into_the_sharded_mode_as_the_whole_model(tmp_path):
    from e2e import torchrun_launch
    argv, env = torchrun_launch(os.path.abspath(__file__), 2, dict(os.environ), script_args=[str(tmp_path)])
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len([f for f in os.listdir(tmp_path / "float16") if f.endswith(".safetensors")]) > 1  # an index
    result = json.loads(next(line for line in done.stdout.splitlines() if "RESULT " in line).split("RESULT ", 1)[1])
    for rank in result:
        for name in ("float32", "bfloat16", "float16", "float32+lora", "gemma3"):
            got = rank[name]
            assert got["logits_equal"] and got["loss_equal"], (name, got)
            assert got["reads_per_layer"] and got["outside_reads_no_layer"], (name, got)
            assert got["blocks"] == LAYERS and got["frozen_sharded"] > 0, (name, got)
        for name in ("float32", "bfloat16", "float16", "gemma3"):
            assert rank[name]["gathered"] == rank[name]["frozen_sharded"] and not rank[name]["mismatched"], rank[name]
            assert rank[name]["new"] == [], rank[name]
        lora = rank["float32+lora"]
        assert lora["new"] and all(".lora_" in n for n in lora["new"]) and lora["lora_B_zero"], lora
        assert lora["lora_A_nonzero"] and lora["trainable_all_new"], lora
        wrong = rank["float32 layer 1 from layer 0"]  # the checks see a layer read from the wrong place
        assert not wrong["logits_equal"] and wrong["mismatched"] and not wrong["reads_per_layer"], wrong


def case(root):
    """(each rank) The checkpoints saved under `root` by rank 0, each loaded whole and sharded; rank 0 prints
    `RESULT [per rank]`."""
    sys.path.insert(0, ROOT)
    import torch
    import torch.distributed as dist
    import transformers

    from nbddp.runtime.shard_load import NbddpCheckpoint, nbddp_load_sharded
    dist.init_process_group("gloo")
    if dist.get_rank() == 0:
        save_checkpoints(root)
    dist.barrier()
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(2))
    layer_of = lambda key: int(key.split(".")[2]) if key.startswith("model.layers.") else None  # noqa: E731

    def with_lora(model):
        import peft
        return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"]))

    runs = [("float32", "float32", {}), ("bfloat16", "bfloat16", {}), ("float16", "float16", {}),
            ("float32 layer 1 from layer 0", "float32",
             {"key_of": lambda key: key.replace("model.layers.1.", "model.layers.0.")}),
            ("float32+lora", "float32", {"prepare": with_lora}), ("gemma3", "float32", {})]
    mine = {}
    for name, dtype, how in runs:
        folder, dtype = os.path.join(root, name.split()[0].split("+")[0]), getattr(torch, dtype)
        whole = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
        model, shards = nbddp_load_sharded(folder, dtype=dtype, **how)
        model.eval()
        with torch.no_grad():
            a, b = whole(input_ids=ids, labels=ids), model(input_ids=ids, labels=ids)
        stored = NbddpCheckpoint(folder)
        names = {id(p): n.replace("base_model.model.", "").replace(".base_layer", "")
                 for n, p in model.named_parameters()}
        mismatched, gathered = [], 0
        for block in shards.blocks:
            shards.use(block, False)
            for param, *_ in block.layout:
                gathered += 1
                key = names[id(param)]
                if param.dtype != dtype or not torch.equal(param.data, stored.get(key)):
                    mismatched.append(key)
        shards.free()
        trainable = [n for n, p in model.named_parameters() if p.requires_grad]
        mine[name] = {
            "logits_equal": torch.equal(a.logits, b.logits), "loss_equal": a.loss.item() == b.loss.item(),
            "max_abs_logit_diff": (a.logits.float() - b.logits.float()).abs().max().item(),
            "blocks": len(shards.blocks), "frozen_sharded": len(shards.ignored), "gathered": gathered,
            "mismatched": mismatched, "new": shards.new,
            "reads_per_layer": all(keys and all(layer_of(k) == i for k in keys)
                                   for i, keys in enumerate(shards.loaded["blocks"])),
            "outside_reads_no_layer": all(layer_of(k) is None for k in shards.loaded["outside"]),
            "lora_B_zero": all(not p.any() for n, p in model.named_parameters() if ".lora_B." in n),
            "lora_A_nonzero": all(p.any() for n, p in model.named_parameters() if ".lora_A." in n),
            "trainable_all_new": sorted(trainable) == sorted(shards.new)}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(every), flush=True)
    from runtime_cases._layer import finish
    finish()  # and leave at once: Python's own exit can abort in gloo's teardown (finish says why)


if __name__ == "__main__":
    case(sys.argv[1])
