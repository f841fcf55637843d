"""bitsandbytes 4-bit weights loaded straight into the sharded mode (nbddp/runtime/shard_quant.py, docs/sharded.md):
a tiny random-weight Llama saved in fp16, loaded on 2 NCCL ranks (a) quantized on load and (b) from the 4-bit
checkpoint transformers saves of it (pre-quantized: packed weights and their states), each decoder layer quantized or
rebuilt on the rank's GPU and sharded at once. Logits equal, bit for bit, those of the whole model transformers
loads from the same folder with the same quantization; every layer's packed bytes, gathered, equal the whole
model's; each layer's step read that layer's keys alone (with the states' keys, pre-quantized).

Needs 2 CUDA GPUs and bitsandbytes (the GPU machines; skipped elsewhere, saying why). This file is also the case
that torchrun runs on each rank (`python test_shard_quant.py FOLDER`)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS, VOCAB = 3, 96


def _needs_two_gpus_and_bitsandbytes():
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs (the sharded 4-bit load quantizes on each rank's GPU)")
    pytest.importorskip("bitsandbytes", reason="needs bitsandbytes (the GPU machines: .whl, ../shared/gpu/README.md)")


def test_4bit_loads_shard_layer_by_layer_as_transformers_loads_them_whole(tmp_path):
    _needs_two_gpus_and_bitsandbytes()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(torchrun + [os.path.abspath(__file__), str(tmp_path)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                              [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])))
    assert done.returncode == 0, done.stderr[-4000:]
    results = [json.loads(line.split("RESULT ", 1)[1]) for line in done.stdout.splitlines() if "RESULT " in line]
    assert len(results) == 2
    for rank in results:
        for name in ("quantize-on-load", "pre-quantized"):
            got = rank[name]
            assert got["logits_equal"] and got["packed_equal"], (name, got)
            assert got["linear4bit"] == 7 * LAYERS and got["blocks"] == LAYERS and got["state_bytes"] > 0, (name, got)
            assert got["reads_per_layer"] and got["quantized_marks"], (name, got)
        assert rank["pre-quantized"]["stat_keys_read"] > 0


def _save(root):
    import torch
    import transformers
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=LAYERS,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(torch.float16).save_pretrained(os.path.join(root, "fp16"))


def _rank(root):
    import torch
    import torch.distributed as dist
    import transformers

    from nbddp.runtime import shard_quant as q
    from nbddp.runtime.shard_load import nbddp_load_sharded
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    device = torch.device("cuda", local)
    bnb = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                          bnb_4bit_compute_dtype=torch.float16)
    if dist.get_rank() == 0:
        _save(root)
        whole = transformers.LlamaForCausalLM.from_pretrained(os.path.join(root, "fp16"), dtype=torch.float16,
                                                              quantization_config=bnb, device_map={"": device})
        whole.save_pretrained(os.path.join(root, "nf4"))  # transformers' 4-bit serialization
        del whole
    dist.barrier()
    ids = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(1)).to(device)
    out = {}
    for name, folder, kwargs in (("quantize-on-load", "fp16", {"quantization_config": bnb}),
                                 ("pre-quantized", "nf4", {})):
        folder = os.path.join(root, folder)
        whole = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float16, device_map={"": device},
                                                              **kwargs)
        with torch.no_grad():
            reference = whole(ids).logits
        config = transformers.AutoConfig.from_pretrained(folder)
        quantizer, dtype = q.nbddp_quantizer("test", config, kwargs, torch.float16, device)
        model, shards = nbddp_load_sharded(folder, device=device, dtype=dtype, config=config,
                                           model_cls=transformers.LlamaForCausalLM,
                                           skeleton=q.nbddp_quant_skeleton(quantizer, dtype, device),
                                           make=q.nbddp_quant_maker(device, dtype, quantizer.pre_quantized))
        q.nbddp_quant_finish(model, quantizer)
        with torch.no_grad():
            logits = model(ids).logits
        packed = True
        wholes = dict(whole.named_parameters())
        for index, block in enumerate(shards.blocks):  # each layer gathered: the whole model's bytes
            shards.use(block, False)
            torch.cuda.synchronize()
            for pname, param in model.model.layers[index].named_parameters():
                ref = wholes[f"model.layers.{index}.{pname}"]
                packed &= param.dtype == ref.dtype and torch.equal(param.data.view(torch.uint8),
                                                                  ref.data.view(torch.uint8))
        blocks = shards.loaded["blocks"]
        out[name] = {
            "logits_equal": bool(torch.equal(logits, reference)),
            "max_abs_diff": float((logits.float() - reference.float()).abs().max()),
            "packed_equal": bool(packed), "blocks": len(shards.blocks), "state_bytes": shards.state_bytes(),
            "linear4bit": sum(type(m).__name__ == "Linear4bit" for m in model.modules()),
            "reads_per_layer": all(k.startswith(f"model.layers.{i}.") for i, keys in enumerate(blocks) for k in keys),
            "stat_keys_read": sum(".weight." in k for keys in blocks for k in keys),
            "quantized_marks": bool(getattr(model, "is_loaded_in_4bit", False) and model.hf_quantizer is quantizer
                                    and model.config.quantization_config is not None)}
        shards.free()
        del whole, model
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()
    if dist.is_initialized() is False and int(os.environ["RANK"]) == 0:
        shutil.rmtree(os.path.join(root, "nf4"), ignore_errors=True)


if __name__ == "__main__":
    _rank(sys.argv[1])
