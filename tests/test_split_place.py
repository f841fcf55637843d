"""Split mode's placement (nbddp/runtime/split_place.py): the layers cut by their bytes and the activations where
they land, every tensor named once, the notebook's own placement kept."""
import types

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from accelerate.utils.modeling import check_device_map  # noqa: E402

from nbddp.runtime.split_place import (_nbddp_load_bits, _nbddp_patch_split, nbddp_split_cut,  # noqa: E402
                                       nbddp_split_map)

GIB = 2 ** 30


@pytest.mark.parametrize("fixed, layers, free, counts", [
    ([0, 0], [1] * 10, [10, 10], [5, 5]),
    ([1, 5], [1] * 10, [10, 10], [7, 3]),  # the last GPU's head and logits: fewer layers there
    ([0, 0], [1] * 9, [6, 12], [3, 6]),  # as a share of each GPU's free memory
    ([0, 0, 0], [1] * 9, [10, 10, 10], [3, 3, 3]),
    ([0, 0], [4, 1, 1, 1, 1], [10, 10], [1, 4]),  # bytes, not counts
    ([0, 0], [1] * 10, [2, 2], [5, 5]),  # more than fits: still the most even cut
])
def test_the_cut_makes_the_largest_share_as_small_as_it_can(fixed, layers, free, counts):
    assert nbddp_split_cut(fixed, layers, free) == counts


def meta_model(tied, vocab=256, layers=8):
    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=vocab,
                                      tie_word_embeddings=tied)
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(config)


@pytest.mark.parametrize("tied", [False, True])
def test_every_tensor_is_placed_once_the_layers_in_order_and_the_head_where_its_weight_is(tied):
    model = meta_model(tied)
    placed, counts, used = nbddp_split_map(model, [GIB, GIB], bits=16, tokens=256)
    check_device_map(model, placed)  # accelerate's own check: every parameter and buffer has a device
    layers = [placed[f"model.layers.{i}"] for i in range(8)]
    assert layers == sorted(layers) and sum(counts) == 8 and set(layers) == {0, 1}
    assert placed["model.embed_tokens"] == 0
    assert placed["lm_head"] == (0 if tied else 1) and placed["model.norm"] == 1
    assert not any(key.startswith(other + ".") for key in placed for other in placed)  # no name inside another
    assert len(used) == 2


def full_size(family, **shape):
    """A full-size causal LM of `family` (transformers' `<family>ForCausalLM`) on the meta device, head untied."""
    config = getattr(transformers, f"{family}Config")(**shape, tie_word_embeddings=False)
    with torch.device("meta"):
        return getattr(transformers, f"{family}ForCausalLM")(config)


def test_the_head_and_its_logits_take_layers_off_their_gpu_and_the_estimates_come_out_even():
    """A Qwen2.5-7B shape in 4-bit over two 6 GiB GPUs (where accelerate's "balanced" put 6 layers on the first and
    22 and the head on the second, which ran out of memory): more layers on the first GPU, the two within 5%."""
    model = full_size("Qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                      num_attention_heads=28, num_key_value_heads=4, vocab_size=152064)
    placed, counts, used = nbddp_split_map(model, [6 * GIB, 6 * GIB], bits=4)
    assert counts == [19, 9], counts  # docs/sharded.md's figure
    assert max(used) / min(used) < 1.05, used
    fewer, _, _ = nbddp_split_map(model, [6 * GIB, 6 * GIB], bits=4, tokens=128)
    assert sum(v == 1 for v in fewer.values()) > sum(v == 1 for v in placed.values())  # less logits: more layers


def test_a_16_bit_8b_model_over_two_15_gib_gpus_is_cut_17_15():
    model = full_size("Llama", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256)
    _, counts, used = nbddp_split_map(model, [15 * GIB, 15 * GIB], bits=16)
    assert counts == [17, 15] and max(used) / min(used) < 1.05, (counts, used)  # docs/sharded.md's figure


def test_a_model_as_it_trains_counts_its_trained_values_with_their_gradients_and_optimizer_state():
    model = meta_model(False)
    for name, param in model.named_parameters():
        param.requires_grad = name.startswith("model.layers.0.")  # one layer trains: 16 bytes a value
    placed, counts, _ = nbddp_split_map(model, [GIB, GIB], tokens=1)
    assert counts[0] < counts[1]  # the trained layer weighs as several frozen ones


@pytest.mark.parametrize("kwargs, config, bits", [
    ({"load_in_4bit": True}, {}, 4),
    ({"quantization_config": {"load_in_4bit": True}}, {}, 4),
    ({"quantization_config": transformers.BitsAndBytesConfig(load_in_8bit=True)}, {}, 8),
    ({}, {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}, 4),  # pre-quantized
    ({"dtype": torch.float32}, {}, 32),
    ({"torch_dtype": "float16"}, {}, 16),
    ({}, {}, 16),
])
def test_the_loads_precision(kwargs, config, bits):
    assert _nbddp_load_bits(types.SimpleNamespace(**config), kwargs) == bits


def patched(monkeypatch):
    """A model class whose from_pretrained records the device_map it is given, patched as in split mode, on 2 GPUs
    of 1 GiB free each."""
    seen = []

    class Base(transformers.LlamaForCausalLM):
        @classmethod
        def from_pretrained(cls, name, *args, **kwargs):
            seen.append(kwargs.get("device_map"))

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda gpu: (GIB, 2 * GIB))
    _nbddp_patch_split(types.SimpleNamespace(PreTrainedModel=Base))
    return Base, seen


def test_the_patched_load_gets_the_placement_where_it_asks_for_balancing_and_keeps_its_own_otherwise(
        tmp_path, monkeypatch, capsys):
    meta_model(False).config.save_pretrained(tmp_path)
    Base, seen = patched(monkeypatch)
    Base.from_pretrained(str(tmp_path), device_map="balanced")
    Base.from_pretrained(str(tmp_path), device_map="auto", dtype=torch.float16)
    for own in ("sequential", "balanced_low_0", {"": 0}):
        Base.from_pretrained(str(tmp_path), device_map=own)
    Base.from_pretrained(str(tmp_path), device_map="balanced", max_memory={0: "1GiB", 1: "1GiB"})
    assert all(isinstance(m, dict) and m["lm_head"] == 1 for m in seen[:2])
    assert seen[2:] == ["sequential", "balanced_low_0", {"": 0}, "balanced"]
    out = capsys.readouterr().out
    assert "Base.from_pretrained(" in out and "layers per GPU 4 / 4" in out and "GiB" in out
    assert "head and loss on the last GPU" in out


def test_the_line_says_a_tied_head_stays_on_the_first_gpu(tmp_path, monkeypatch, capsys):
    meta_model(True).config.save_pretrained(tmp_path)
    Base, seen = patched(monkeypatch)
    Base.from_pretrained(str(tmp_path), device_map="balanced")
    assert seen[0]["lm_head"] == 0 and "head and loss on the first GPU, with the embeddings it shares" in \
        capsys.readouterr().out


def test_a_model_it_cannot_make_keeps_accelerates_placement_and_says_why(tmp_path, monkeypatch, capsys):
    Base, seen = patched(monkeypatch)
    Base.from_pretrained(str(tmp_path / "nothing"), device_map="balanced")
    assert seen == ["balanced"]
    out = capsys.readouterr().out
    assert "accelerate's placement (OSError in " in out and " line " in out  # where it failed, for a report
