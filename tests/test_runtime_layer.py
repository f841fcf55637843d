"""The runtime layer in one process: decisions, overrides, shims, import hooks, and the converter's global-batch step."""
import dataclasses
import json
import os
import subprocess
import sys
import types

import pytest
import torch

CASES = os.path.join(os.path.dirname(__file__), "runtime_cases")
sys.path.insert(0, CASES)
from _layer import load_layer  # noqa: E402


@pytest.fixture
def layer(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("NBDDP_", "UNSLOTH_")):
            monkeypatch.delenv(name)
    mod = load_layer()
    yield mod
    sys.meta_path.remove(mod.NBDDP_IMPORTS)


def test_layer_imports_no_training_library_at_start():
    code = ("import sys; sys.path.insert(0, %r); from _layer import load_layer; load_layer(); "
            "print([m for m in ('transformers', 'trl', 'peft', 'unsloth') if m in sys.modules])" % CASES)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("mode, all_used, expected", [
    ("reentrant", True, (False, False, False)),  # find_unused=False is the cure; no static graph (docs/runtime.md)
    ("unsloth", True, (False, False, False)),
    ("non-reentrant", True, (False, False, False)),
    ("none", True, (False, False, False)),
    ("none", False, (False, True, False)),
    ("reentrant", False, (False, True, True)),
])
def test_strategy(layer, mode, all_used, expected):
    assert layer.nbddp_ddp_strategy(mode, all_used)[:3] == expected


def test_overrides_and_unsloth_aliases(layer, monkeypatch):
    monkeypatch.setenv("UNSLOTH_DISABLE_DDP_STATIC_GRAPH_FOR_GRAD_CHECKPOINT", "1")
    static, find_unused, _, why = layer.nbddp_ddp_strategy("reentrant")
    assert (static, find_unused) == (False, False) and "UNSLOTH_DISABLE_DDP_STATIC_GRAPH_FOR_GRAD_CHECKPOINT" in why
    assert layer.nbddp_ddp_strategy("none")[0] is False
    monkeypatch.setenv("NBDDP_STATIC_GRAPH", "1")  # NBDDP_* wins over the aliases
    assert layer.nbddp_ddp_strategy("reentrant")[0] is True
    monkeypatch.setenv("NBDDP_FIND_UNUSED", "1")
    assert layer.nbddp_ddp_strategy("none")[1] is True
    monkeypatch.delenv("NBDDP_STATIC_GRAPH")
    monkeypatch.setenv("UNSLOTH_DISABLE_DDP_STATIC_GRAPH", "1")
    assert layer.nbddp_ddp_strategy("reentrant")[0] is False


def test_checkpointing_mode_detection(layer, monkeypatch):
    import functools

    from torch.utils.checkpoint import checkpoint

    block = torch.nn.Linear(2, 2)
    model = torch.nn.Sequential(block)
    assert layer.nbddp_checkpointing_mode(model) == "none"
    monkeypatch.setenv("UNSLOTH_USE_GRADIENT_CHECKPOINTING", "1")
    assert layer.nbddp_checkpointing_mode(model) == "unsloth"
    block.gradient_checkpointing = True
    block._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=False)
    assert layer.nbddp_checkpointing_mode(model) == "non-reentrant"
    block._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=True)
    assert layer.nbddp_checkpointing_mode(model) == "reentrant"
    sys.path.insert(0, os.path.join(CASES, "fake_zoo"))
    from unsloth_zoo.gradient_checkpointing import unsloth_offloaded_checkpoint
    block._gradient_checkpointing_func = unsloth_offloaded_checkpoint
    assert layer.nbddp_checkpointing_mode(model) == "unsloth"
    layer.nbddp_use_non_reentrant(model, offload=True)
    assert layer.nbddp_checkpointing_mode(model) == "non-reentrant"
    loop = torch.nn.Module()
    loop.module = model
    assert layer.nbddp_find_module(loop, lambda m: m is block) is None  # blocks are not wrappers' children
    assert layer.nbddp_find_module(loop, lambda m: m is model) is model
    model.module = loop  # a wrapping cycle: the search ends
    assert layer.nbddp_find_module(loop, lambda m: False) is None


def test_offload_checkpoint_gradients(layer):
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    layer.nbddp_offload_checkpoint(lambda t: lin(t).tanh(), x).sum().backward()
    got = [x.grad.clone(), lin.weight.grad.clone()]
    x.grad = lin.weight.grad = None
    lin(x).tanh().sum().backward()
    torch.testing.assert_close(got, [x.grad, lin.weight.grad])


def test_tiled_mlp_gradients_and_hooks_fire_once(layer):
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    x = torch.randn(2, 6, 4, requires_grad=True)
    fired = []
    for p in mlp.parameters():
        p.register_post_accumulate_grad_hook(lambda p: fired.append(p))
    layer.nbddp_tiled_mlp(mlp, x, 3).pow(2).sum().backward()
    assert len(fired) == 4  # one per parameter, not one per chunk
    got = [x.grad.clone()] + [p.grad.clone() for p in mlp.parameters()]
    x.grad = None
    for p in mlp.parameters():
        p.grad = None
    mlp(x).pow(2).sum().backward()
    torch.testing.assert_close(got, [x.grad] + [p.grad for p in mlp.parameters()])


def test_tiled_mlp_patch_skips_unknown_api(layer, capsys):
    fake = types.ModuleType("fake_tiled")

    class TiledMLP(torch.autograd.Function):
        @staticmethod
        def forward(ctx, fn, x):
            return x

    fake.TiledMLP = TiledMLP
    original = TiledMLP.apply
    layer._nbddp_patch_tiled_mlp(fake)
    assert fake.TiledMLP.apply == original
    assert "API nbddp does not know" in capsys.readouterr().out


def test_peft_shim_is_a_no_op_where_peft_has_the_field(layer):
    import peft

    before = peft.LoraConfig.__init__
    layer._nbddp_patch_peft(peft)
    assert peft.LoraConfig.__init__ is before
    assert peft.LoraConfig(r=4, ensure_weight_tying=True).ensure_weight_tying is True


def test_peft_shim_drops_the_keyword_where_peft_lacks_it(layer):
    @dataclasses.dataclass
    class LoraConfig:
        r: int = 8

    fake = types.SimpleNamespace(LoraConfig=LoraConfig)
    with pytest.raises(TypeError):
        LoraConfig(r=4, ensure_weight_tying=True)
    layer._nbddp_patch_peft(fake)
    assert LoraConfig(r=4, ensure_weight_tying=True).r == 4


def test_xformers_bias_follows_query_device(layer):
    seen = []
    fake = types.SimpleNamespace(memory_efficient_attention=lambda q, k, v, attn_bias=None: seen.append(attn_bias))
    layer._nbddp_patch_xformers(fake)
    q = torch.zeros(1, device="meta")
    fake.memory_efficient_attention(q, q, q, torch.zeros(1))
    assert seen[0].device.type == "meta"
    fake.memory_efficient_attention(q, q, q, None)
    assert seen[1] is None


def test_import_hook_patches_on_first_import(layer, tmp_path, monkeypatch):
    (tmp_path / "nbddp_probe_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    layer.NBDDP_IMPORTS.watch("nbddp_probe_mod", lambda m: setattr(m, "VALUE", 2))
    import nbddp_probe_mod
    assert nbddp_probe_mod.VALUE == 2
    sys.modules.pop("nbddp_probe_mod")


def test_accumulation_divides_only_evenly(layer, monkeypatch, capsys):
    layer.NBDDP_WORLD_SIZE = 1
    assert layer.nbddp_accumulation(4) == 4
    layer.NBDDP_WORLD_SIZE = 2
    layer.NBDDP_IS_MAIN = True
    assert layer.nbddp_accumulation(4) == 2
    assert layer.nbddp_accumulation(layer.nbddp_accumulation(4)) == 2  # never divided twice
    layer._NBDDP_SAID.clear()
    assert layer.nbddp_accumulation(3, batch=2) == 3
    assert "effective global batch is 2 x 3 x 2" in capsys.readouterr().out


def _notebook(code):
    return json.dumps({"cells": [{"cell_type": "code", "id": "c1", "source": code, "metadata": {}, "outputs": [],
                                  "execution_count": None}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})


def test_converter_keeps_global_batch():
    from nbddp.pipeline import convert_notebook
    from nbddp.transforms.base import Options

    code = "args = SFTConfig(per_device_train_batch_size = 2, gradient_accumulation_steps = 4)\n"
    kept = convert_notebook(_notebook(code), options=Options(keep_global_batch=True))
    assert "gradient_accumulation_steps = nbddp_accumulation(4)" in kept.script
    assert any("effective global batch 2 x 4 = 8" in n.text for n in kept.report.changes)
    plain = convert_notebook(_notebook(code))
    assert "nbddp_accumulation(4)" not in plain.script
    assert any("2 x 4 x N = 8N" in n.text for n in plain.report.changes)
    unknown = convert_notebook(_notebook("args = SFTConfig(gradient_accumulation_steps = steps)\n"))
    assert any("cannot tell" in n.text for n in unknown.report.changes)


def test_trainer_patch_sets_static_graph_at_first_step_without_accelerator_hook(layer, monkeypatch):
    calls = []

    class Trainer:  # a transformers without _build_accelerator_args
        args = types.SimpleNamespace(ddp_find_unused_parameters=None)

        def training_step(self, model, inputs):
            calls.append("step")
            return 1.0

    layer.NBDDP_WORLD_SIZE = 2
    monkeypatch.setattr(layer, "nbddp_decide", lambda model, args: (True, False))
    monkeypatch.setattr(layer, "nbddp_apply_to_ddp", lambda model, static: calls.append(("apply", static)) or True)
    layer._nbddp_patch_trainer(types.SimpleNamespace(Trainer=Trainer))
    trainer = Trainer()
    trainer.training_step(object(), {})
    trainer.training_step(object(), {})
    assert calls == [("apply", True), "step", "step"]
