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


def test_balance_window_keeps_each_step_and_evens_the_ranks(layer):
    lengths = [5, 90, 7, 80, 6, 85, 9, 70]  # drawn: rank 0 gets the four long samples, rank 1 the short ones
    drawn = [[0, 1], [2, 3], [4, 5], [6, 7]]  # batch i -> rank i % 2; two micro-batches per rank
    dealt = layer.nbddp_balance_window(drawn, lengths.__getitem__, 2)
    assert sorted(i for b in dealt for i in b) == list(range(8))
    assert all(len(b) == 2 for b in dealt)

    def padded(batches, rank):
        return sum(len(b) * max(lengths[i] for i in b) for b in batches[rank::2])

    assert [padded(drawn, r) for r in (0, 1)] == [2 * 90 + 2 * 85, 2 * 80 + 2 * 70]
    assert max(padded(dealt, r) for r in (0, 1)) < max(padded(drawn, r) for r in (0, 1))
    assert layer.nbddp_balance_window(dealt, lengths.__getitem__, 2) == dealt  # dealing twice changes nothing
    ragged = [[0, 1], [2]]  # the epoch's last, short batch: left as drawn
    assert layer.nbddp_balance_window(ragged, lengths.__getitem__, 2) == ragged


def test_balanced_batches_window_and_delegation(layer):
    class Inner:
        batch_size, drop_last, sampler = 2, False, "the sampler"

        def __iter__(self):
            return iter([[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]])

        def __len__(self):
            return 5

    lengths = [5, 90, 7, 80, 6, 85, 9, 70, 1, 2]
    wrapped = layer.NbddpBalancedBatches(Inner(), lengths.__getitem__, world=2, accumulation=2)
    assert (wrapped.batch_size, wrapped.drop_last, wrapped.sampler, len(wrapped)) == (2, False, "the sampler", 5)
    out = list(wrapped)
    assert sorted(i for b in out[:4] for i in b) == list(range(8)) and out[4] == [8, 9]
    assert out[:4] != [[0, 1], [2, 3], [4, 5], [6, 7]]  # the full window was re-dealt, the partial one not


def _loader_and_trainer(layer, **args):
    class BatchSamplerShard:
        split_batches, num_processes, batch_sampler = False, 2, [[0, 1]]

    class Data:
        column_names = ["input_ids"]

        def select_columns(self, names):
            return [{"input_ids": [1] * n} for n in (3, 1)]

    loader = types.SimpleNamespace(batch_sampler=BatchSamplerShard(), dataset=Data())
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(**{
        "gradient_accumulation_steps": 2, "average_tokens_across_devices": True, "train_sampling_strategy": "random",
        "length_column_name": "length", **args}), model_accepts_loss_kwargs=True, processing_class=None)
    layer.NBDDP_WORLD_SIZE, layer.NBDDP_IS_MAIN = 2, True
    return loader, trainer


@pytest.mark.parametrize("args, env, balanced, says", [
    ({}, None, True, "length-balanced ranks: each optimizer step's 2 x 2 micro-batches"),  # on by default
    ({}, "1", True, "length-balanced ranks: each optimizer step's 2 x 2 micro-batches"),
    ({"average_tokens_across_devices": False}, None, False, "would change the gradient"),
    ({"average_tokens_across_devices": False}, "force", True, "length-balanced ranks: each"),
    ({}, "0", False, None),  # off: nothing said
    ({"train_sampling_strategy": "group_by_length"}, "1", False, "length-aware sampling order of its own"),
])
def test_balance_loader_only_where_the_gradient_cannot_change(layer, monkeypatch, capsys, args, env, balanced, says):
    if env is not None:
        monkeypatch.setenv("NBDDP_BALANCE_LENGTHS", env)
    loader, trainer = _loader_and_trainer(layer, **args)
    layer.nbddp_balance_loader(loader, trainer)
    wrapped = loader.batch_sampler.batch_sampler
    assert isinstance(wrapped, layer.NbddpBalancedBatches) is balanced
    out = capsys.readouterr().out
    assert (says in out) if says else "length-balanced" not in out
    if balanced:
        assert [wrapped.length(i) for i in (0, 1)] == [3, 1]
        layer.nbddp_balance_loader(loader, trainer)  # a second call wraps nothing twice
        assert loader.batch_sampler.batch_sampler is wrapped
