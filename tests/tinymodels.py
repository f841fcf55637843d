"""Tiny random-weight models, tokenizers and datasets for tests: built offline from a config, in a second or two.

    from tinymodels import save_tiny_llama, EXAMPLE_NOTEBOOK

    path = save_tiny_llama(tmp_path / "tiny-llama")        # model + tokenizer; from_pretrained(path) loads both

The same seed gives the same weights and vocabulary, byte for byte, so ranks that each build one agree.
Heavy libraries are imported inside the functions: importing this module costs nothing.
"""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_NOTEBOOK = ROOT / "notebooks" / "tiny_llama_sft.ipynb"
SEED = 3407
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")

ALPACA_ROWS = [
    {"instruction": "Name a primary color.", "input": "", "output": "Red is a primary color."},
    {"instruction": "Translate to French.", "input": "Good morning", "output": "Bonjour."},
    {"instruction": "What is the capital of France?", "input": "", "output": "The capital of France is Paris."},
    {"instruction": "Add the two numbers.", "input": "2 and 3", "output": "2 + 3 = 5."},
    {"instruction": "Give an antonym.", "input": "happy", "output": "sad"},
    {"instruction": "Sort the numbers.", "input": "5, 1, 4", "output": "1, 4, 5"},
    {"instruction": "Name a planet.", "input": "", "output": "Mars is a planet."},
    {"instruction": "Convert to uppercase.", "input": "hello world", "output": "HELLO WORLD"},
]

ALPACA_PROMPT = """Below is an instruction that describes a task, paired with an input that provides further context. \
Write a response that appropriately completes the request.

### Instruction:
{}

### Input:
{}

### Response:
{}"""


def alpaca_texts(rows=ALPACA_ROWS, eos: str = "</s>") -> list[str]:
    """Each row as one Alpaca prompt with its response and the EOS token (what SFT trains on)."""
    return [ALPACA_PROMPT.format(r["instruction"], r["input"], r["output"]) + eos for r in rows]


def train_tokenizer(texts=None, vocab_size: int = 384):
    """A byte-level BPE tokenizer trained on `texts` (default: the Alpaca rows), as a PreTrainedTokenizerFast
    with <unk> <s> </s> <pad> (ids 0-3) and only input_ids/attention_mask as model inputs."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(list(texts if texts is not None else alpaca_texts()), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_input_names=["input_ids", "attention_mask"])


def tiny_llama_config(tokenizer=None, **overrides):
    """A LlamaConfig of 2 layers, hidden 64, 4 heads (2 KV heads); vocab and special ids from `tokenizer`."""
    from transformers import LlamaConfig

    settings = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                    tie_word_embeddings=True)
    if tokenizer is not None:
        settings.update(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    settings.update(overrides)
    return LlamaConfig(**settings)


def tiny_llama(tokenizer=None, seed: int = SEED, **overrides):
    """A LlamaForCausalLM with random weights drawn from `seed` (float32, CPU)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(tokenizer, **overrides))


def save_tiny_llama(path, *, seed: int = SEED, texts=None, **overrides) -> Path:
    """Build tokenizer + model and save both to `path` (a folder from_pretrained can load); returns the path."""
    path = Path(path)
    tokenizer = train_tokenizer(texts)
    tiny_llama(tokenizer, seed, **overrides).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
