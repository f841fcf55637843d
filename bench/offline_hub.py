#!/usr/bin/env python3
"""Build an offline Hugging Face cache that serves the hub ids the Unsloth notebooks load.

Runs on the GPU machine (no hub there): random-weight models of the real architecture family, cut to a few
layers, with a tokenizer trained on the spot (the family's special tokens and a chat template), stored under
every repo id the notebook names and every related name Unsloth's mapper tables give (…-bnb-4bit,
…-unsloth-bnb-4bit, the upstream org); small datasets under the dataset ids, in the datasets-cache layout
that `load_dataset(id)` reads with HF_DATASETS_OFFLINE=1 (see ../shared/gpu/README.md beside the checkout).

    python bench/offline_hub.py --home /tmp/hf [--models tinyllama,llama31,...] [--datasets all]
           [--layers llama31=16 ...] [--text-scale 8]     (a fresh --home for another depth or text length)
    export HF_HOME=/tmp/hf HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
"""
from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import random
import shutil
import sys
import tempfile
import time

COMMIT = "0" * 39 + "1"  # refs/main of every fake repo

# ---- models -------------------------------------------------------------------------------------------
# family -> (config class name, config kwargs at reduced depth, tokenizer style, repo ids notebooks load)
FAMILIES = {
    "tinyllama": ("LlamaConfig", dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=32,
                                      num_key_value_heads=4, vocab_size=32000, num_hidden_layers=4,
                                      max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5),
                  "llama2", ["unsloth/tinyllama-bnb-4bit", "unsloth/tinyllama"]),
    "llama31": ("LlamaConfig", dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                    num_key_value_heads=8, vocab_size=128256, num_hidden_layers=2,
                                    max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 8192}),
                "llama3", ["unsloth/Llama-3.1-8B", "unsloth/Meta-Llama-3.1-8B"]),
    "llama32_3b": ("LlamaConfig", dict(hidden_size=3072, intermediate_size=8192, num_attention_heads=24,
                                       num_key_value_heads=8, vocab_size=128256, num_hidden_layers=2,
                                       max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                                       tie_word_embeddings=True,
                                       rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                     "high_freq_factor": 4.0,
                                                     "original_max_position_embeddings": 8192}),
                   "llama3", ["unsloth/Llama-3.2-3B-Instruct"]),
    "mistral03": ("MistralConfig", dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                        num_key_value_heads=8, vocab_size=32768, num_hidden_layers=2,
                                        max_position_embeddings=32768, rope_theta=1000000.0, sliding_window=None),
                  "mistral", ["unsloth/mistral-7b-instruct-v0.3-bnb-4bit", "unsloth/mistral-7b-v0.3",
                              "unsloth/mistral-7b-instruct-v0.3"]),
    "zephyr": ("MistralConfig", dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                                     num_key_value_heads=8, vocab_size=32000, num_hidden_layers=2,
                                     max_position_embeddings=32768, rope_theta=10000.0, sliding_window=4096),
               "zephyr", ["unsloth/zephyr-sft-bnb-4bit", "unsloth/zephyr-sft"]),
    "qwen3": ("Qwen3Config", dict(hidden_size=5120, intermediate_size=17408, num_attention_heads=40,
                                  num_key_value_heads=8, head_dim=128, vocab_size=151936, num_hidden_layers=2,
                                  max_position_embeddings=40960, rope_theta=1000000.0, tie_word_embeddings=False,
                                  rms_norm_eps=1e-6),
              "qwen3", ["unsloth/Qwen3-14B"]),
    # Text-only stand-in: the real unsloth/gemma-3-4b-it is Gemma3ForConditionalGeneration (vision tower +
    # processor); this cache serves its text decoder (Gemma3ForCausalLM), which the text notebook trains.
    "gemma3_4b": ("Gemma3TextConfig", dict(hidden_size=2560, intermediate_size=10240, num_attention_heads=8,
                                           num_key_value_heads=4, head_dim=256, vocab_size=262208,
                                           num_hidden_layers=2, max_position_embeddings=131072,
                                           sliding_window=1024, rope_theta=1000000.0),
                  "gemma3", ["unsloth/gemma-3-4b-it"]),
    "gemma3_1b": ("Gemma3TextConfig", dict(hidden_size=1152, intermediate_size=6912, num_attention_heads=4,
                                           num_key_value_heads=1, head_dim=256, vocab_size=262144,
                                           num_hidden_layers=2, max_position_embeddings=32768,
                                           sliding_window=512, rope_theta=1000000.0,
                                           tie_word_embeddings=False),  # see MEAN_COMPLETION_TOKENS
                  "gemma3", ["unsloth/gemma-3-1b-it"]),
}

# families and datasets built by their own function (module:function), with the repo ids they serve
OTHER_FAMILIES = {"qwen25vl": ("hub_vision:build_qwen25vl", ["unsloth/Qwen2.5-VL-7B-Instruct-bnb-4bit"])}
OTHER_DATASETS = {"unsloth/LaTeX_OCR": "hub_vision:build_latex_ocr"}


def _builder(ref):
    import importlib
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    module, name = ref.split(":")
    return getattr(importlib.import_module(module), name)


# Random weights never choose EOS, so each generate() runs to its max_new_tokens. GRPO notebooks sample
# hundreds of tokens per completion (Gemma-3-1B: 768, 4 per prompt, 50 steps), which would spend the whole GPU
# budget generating. These stand-ins are tuned to end a completion after about this many tokens on average.
MEAN_COMPLETION_TOKENS = {"gemma3_1b": 40}

# tokenizer style -> special tokens (bos, eos, pad, unk, extras) and chat template
_LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
_CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
_MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' ' + message['content'] + eos_token }}{% endif %}{% endfor %}")
_ZEPHYR_TEMPLATE = (
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}")
_GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' "
    "else message['role'] %}{{ '<start_of_turn>' + role + '\n' + message['content'] + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
_QWEN_VL_TOKENS = ["<|im_start|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                 "<|video_pad|>"]
# ChatML whose content may be a list of text and image items (an image: the vision tokens)
_QWEN_VL_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

TOKENIZERS = {
    "llama2": dict(bos="<s>", eos="</s>", pad=None, unk="<unk>", extra=[], template=None, add_bos=True),
    "mistral": dict(bos="<s>", eos="</s>", pad=None, unk="<unk>", extra=["[INST]", "[/INST]"],
                    template=_MISTRAL_TEMPLATE, add_bos=True),
    "zephyr": dict(bos="<s>", eos="</s>", pad=None, unk="<unk>", extra=[], template=_ZEPHYR_TEMPLATE,
                   add_bos=True),
    "llama3": dict(bos="<|begin_of_text|>", eos="<|end_of_text|>", pad="<|finetune_right_pad_id|>", unk=None,
                   extra=["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>"],
                   template=_LLAMA3_TEMPLATE, add_bos=True),
    "qwen3": dict(bos=None, eos="<|im_end|>", pad="<|endoftext|>", unk=None,
                  extra=["<|im_start|>", "<think>", "</think>"], template=_CHATML_TEMPLATE, add_bos=False),
    "gemma3": dict(bos="<bos>", eos="<eos>", pad="<pad>", unk="<unk>",
                   extra=["<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>"],
                   template=_GEMMA_TEMPLATE, add_bos=True),
    "qwen2vl": dict(bos=None, eos="<|im_end|>", pad="<|endoftext|>", unk=None, extra=_QWEN_VL_TOKENS,
                    template=_QWEN_VL_TEMPLATE, add_bos=False),
}

# ---- synthetic text -------------------------------------------------------------------------------------
_SYL = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "de", "po", "an", "el", "or", "is", "un", "qu", "ze", "fa"]


def lexicon(n=600, seed=0):
    rng = random.Random(seed)
    words = set()
    while len(words) < n:
        words.add("".join(rng.choice(_SYL) for _ in range(rng.randint(1, 3))))
    return sorted(words) + [str(i) for i in range(10)] + ["the", "a", "is", "of", "and", "to", "in"]


MAX_ROWS = 0  # --max-rows: at most this many rows per split (0: as listed), for shorter launches
TEXT_SCALE = 1.0  # --text-scale: every synthetic sentence this many times longer (e.g. ~1k-token samples)


def sentence(rng, words, lo=6, hi=30):
    n = round(rng.randint(lo, hi) * TEXT_SCALE)
    return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."


def build_tokenizer(style, out_dir, words):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = TOKENIZERS[style]
    specials = [t for t in (spec["bos"], spec["eos"], spec["pad"], spec["unk"]) if t] + spec["extra"]
    tok = Tokenizer(models.BPE(unk_token=spec["unk"]) if spec["unk"] else models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [" ".join(words[i:i + 20]) + " . , ? ! : ; # ( ) [ ] \" ' - + = * / \n" for i in range(0, len(words), 20)]
    corpus += ["### Instruction Input Response system user assistant model human gpt"] * 5
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    if spec["add_bos"] and spec["bos"]:
        from tokenizers import processors
        bos_id = tok.token_to_id(spec["bos"])
        tok.post_processor = processors.TemplateProcessing(single=f"{spec['bos']} $A", pair=f"{spec['bos']} $A $B",
                                                           special_tokens=[(spec["bos"], bos_id)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=spec["bos"], eos_token=spec["eos"],
                                   pad_token=spec["pad"], unk_token=spec["unk"],
                                   additional_special_tokens=spec["extra"], model_max_length=131072)
    if spec["template"]:
        fast.chat_template = spec["template"]
    fast.save_pretrained(out_dir)
    return fast


def build_model(family, out_dir, words, layers=None):
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    cls_name, kwargs, style, _ = FAMILIES[family]
    if layers:
        kwargs = dict(kwargs, num_hidden_layers=layers)
    tok = build_tokenizer(style, out_dir, words)
    ids = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
               pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else None)
    config = getattr(transformers, cls_name)(**kwargs, **ids)
    config.torch_dtype = "bfloat16"

    def tune(model):
        if family in MEAN_COMPLETION_TOKENS:
            specials = set(tok.all_special_ids)
            words = [i for i in range(256, len(tok)) if i not in specials]  # merges: whole words, not bytes
            p = end_generations_early(model, tok.eos_token_id, MEAN_COMPLETION_TOKENS[family], words)
            print(f"offline_hub: {family}: P(eos) per token {p:.4f}", flush=True)
    save_random_model(AutoModelForCausalLM, config, out_dir,
                      GenerationConfig(**{k: v for k, v in ids.items() if v is not None}), tune)


def save_random_model(auto_cls, config, out_dir, generation_config, tune=None):
    """Random bf16 weights for config (seed 0; built on the GPU where there is one), then tune(model), saved with
    generation_config into out_dir."""
    import torch

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(dev):
        model = auto_cls.from_config(config, dtype=torch.bfloat16)
    if tune is not None:
        tune(model)
    model.generation_config = generation_config
    model.save_pretrained(out_dir)
    del model
    if dev == "cuda":
        torch.cuda.empty_cache()


def end_generations_early(model, eos_id, mean_tokens, vocab_ids, c=10.0):
    """Make a completion end after about mean_tokens tokens, by weights alone (whatever the sampling settings).

    Input embedding column 0 becomes a large constant c, so after the final norm every position carries nearly
    the same component along it. The (untied) output head reads that column only for EOS and mean_tokens - 1
    ordinary tokens (from vocab_ids), all with one weight delta: those tokens take ~95% of the probability,
    equally, so EOS is one in mean_tokens with or without top-k (>= mean_tokens) and top-p sampling."""
    import math

    import torch

    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if head.data_ptr() == emb.data_ptr():
        raise ValueError("end_generations_early needs untied input/output embeddings (tie_word_embeddings=False)")
    ids = torch.randint(0, len(vocab_ids), (2, 32), generator=torch.Generator().manual_seed(0))
    ids = torch.tensor(vocab_ids)[ids].to(emb.device)
    lifted = torch.tensor([eos_id] + [v for v in vocab_ids if v != eos_id][:mean_tokens - 1], device=emb.device)
    with torch.no_grad():
        emb[:, 0], head[:, 0] = c, 0.0
        before = model(input_ids=ids).logits.float()[..., eos_id]
        head[eos_id, 0] = 1.0
        slope = (model(input_ids=ids).logits.float()[..., eos_id] - before).mean().item()
        delta = math.log(19 * (head.shape[0] - len(lifted)) / len(lifted)) / slope
        head[lifted, 0] = delta
        return model(input_ids=ids).logits.float().softmax(-1)[..., eos_id].mean().item()


def unsloth_aliases(repo_ids):
    """Every name Unsloth's mapper tables group with one of repo_ids (read from the installed file, not imported)."""
    spec = importlib.util.find_spec("unsloth")
    names = set(repo_ids)
    if spec is None or not spec.submodule_search_locations:
        return sorted(names)
    path = os.path.join(list(spec.submodule_search_locations)[0], "models", "mapper.py")
    scope = {}
    exec(compile(open(path, encoding="utf-8").read(), path, "exec"), scope)
    table = scope.get("__INT_TO_FLOAT_MAPPER") or scope.get("_" + "_INT_TO_FLOAT_MAPPER") or {}
    wanted = {r.lower() for r in repo_ids}
    for key, values in table.items():
        group = [key]
        for v in (values.values() if isinstance(values, dict) else [values]):
            group += [x for x in (v if isinstance(v, (list, tuple)) else [v]) if isinstance(x, str)]
        if wanted & {g.lower() for g in group}:
            names.update(group)
    return sorted(names)


def install_repo(hub_dir, repo_id, source_dir):
    """hub cache entry models--ORG--NAME whose snapshot is source_dir (a link, so weights exist once)."""
    repo = os.path.join(hub_dir, "models--" + repo_id.replace("/", "--"))
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    os.makedirs(os.path.join(repo, "snapshots"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as fh:
        fh.write(COMMIT)
    snap = os.path.join(repo, "snapshots", COMMIT)
    if os.path.lexists(snap):
        os.remove(snap) if os.path.islink(snap) else shutil.rmtree(snap)
    os.symlink(os.path.abspath(source_dir), snap)


# ---- datasets -----------------------------------------------------------------------------------------
def _conv_sharegpt(rng, words, turns=2):
    out = []
    for _ in range(turns):
        out += [{"from": "human", "value": sentence(rng, words)}, {"from": "gpt", "value": sentence(rng, words, 10, 40)}]
    return out


def _gsm8k_row(rng, words):
    a, b = rng.randint(1, 50), rng.randint(1, 50)
    return {"question": f"{sentence(rng, words)} What is {a} plus {b}?",
            "answer": f"{sentence(rng, words)} {a}+{b}={a + b}\n#### {a + b}"}


# dataset id -> (config name or None, {split: (rows, row maker)})
DATASETS = {
    "unsloth/alpaca-cleaned": (None, {"train": (4000, lambda r, w: {
        "output": sentence(r, w, 10, 60), "input": sentence(r, w, 0, 12) if r.random() < 0.4 else "",
        "instruction": sentence(r, w)})}),
    "mlabonne/FineTome-100k": (None, {"train": (1500, lambda r, w: {
        "conversations": _conv_sharegpt(r, w), "source": "synthetic", "score": round(r.uniform(3, 5), 2)})}),
    "philschmid/guanaco-sharegpt-style": (None, {"train": (1500, lambda r, w: {
        "conversations": _conv_sharegpt(r, w)})}),
    "unsloth/OpenMathReasoning-mini": (None, {"cot": (600, lambda r, w: {
        "expected_answer": str(r.randint(1, 99)), "problem_type": "math", "problem_source": "synthetic",
        "generation_model": "none", "pass_rate_72b_tir": "0.5", "problem": sentence(r, w),
        "generated_solution": "<think>\n" + sentence(r, w, 20, 60) + "\n</think>\n" + sentence(r, w),
        "inference_mode": "cot"})}),
    "wikimedia/wikipedia": ("20231101.ko", {"train": (10000, lambda r, w: {
        "id": str(r.randint(1, 10 ** 6)), "url": "https://ko.wikipedia.org/", "title": sentence(r, w, 1, 3),
        "text": sentence(r, w, 30, 120)})}),
    "FreedomIntelligence/alpaca-gpt4-korean": (None, {"train": (1500, lambda r, w: {
        "id": str(r.randint(1, 10 ** 6)), "conversations": _conv_sharegpt(r, w, 1)})}),
    "HuggingFaceH4/ultrafeedback_binarized": (None, {
        s: (n, lambda r, w: (lambda p: {
            "prompt": p, "prompt_id": str(r.randint(1, 10 ** 9)),
            "chosen": [{"role": "user", "content": p}, {"role": "assistant", "content": sentence(r, w, 10, 40)}],
            "rejected": [{"role": "user", "content": p}, {"role": "assistant", "content": sentence(r, w, 10, 40)}],
            "messages": [{"role": "user", "content": p}, {"role": "assistant", "content": sentence(r, w)}],
            "score_chosen": 8.0, "score_rejected": 4.0})(sentence(r, w)))
        for s, n in (("train_prefs", 4000), ("test_prefs", 100))}),
    "openai/gsm8k": ("main", {"train": (500, _gsm8k_row), "test": (50, _gsm8k_row)}),
}


def dataset_root(cache_dir, dataset_id, config="default"):
    """Where `load_dataset(dataset_id, config)` looks offline: datasets' own naming (camelCase -> snake_case)."""
    from datasets.naming import camelcase_to_snakecase

    ns = dataset_id.split("/")
    ns[-1] = camelcase_to_snakecase(ns[-1])
    return os.path.join(cache_dir, "___".join(ns), config, "0.0.0", "offlinehub")


def build_dataset(cache_dir, dataset_id, words, seed=0):
    import datasets
    from datasets.naming import camelcase_to_snakecase

    config, splits = DATASETS[dataset_id]
    config = config or "default"
    target_root = dataset_root(cache_dir, dataset_id, config)
    if os.path.exists(os.path.join(target_root, "dataset_info.json")):
        return target_root
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for split, (n, make) in splits.items():
            rng = random.Random(f"{dataset_id}/{split}/{seed}")
            files[split] = os.path.join(tmp, f"{split}.jsonl")
            with open(files[split], "w", encoding="utf-8") as fh:
                for _ in range(min(n, MAX_ROWS or n)):
                    fh.write(json.dumps(make(rng, words), ensure_ascii=False) + "\n")
        datasets.load_dataset("json", data_files=files, cache_dir=os.path.join(tmp, "c"))
        built = [d for d in glob.glob(os.path.join(tmp, "c", "json", "*", "*", "*"))
                 if os.path.exists(os.path.join(d, "dataset_info.json"))][0]
        os.makedirs(target_root, exist_ok=True)
        prefix = camelcase_to_snakecase(dataset_id.split("/")[-1])
        for f in os.listdir(built):
            if f.endswith(".arrow"):
                shutil.copy(os.path.join(built, f), os.path.join(target_root, f.replace("json-", prefix + "-", 1)))
        info = json.load(open(os.path.join(built, "dataset_info.json")))
        info.update(config_name=config, dataset_name=prefix, builder_name=prefix)
        json.dump(info, open(os.path.join(target_root, "dataset_info.json"), "w"))
    return target_root


def main(argv=None):
    global TEXT_SCALE, MAX_ROWS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--home", required=True, help="HF_HOME to fill (hub/ and datasets/ below it)")
    ap.add_argument("--models", default="all", help="comma-separated families, or all, or none")
    ap.add_argument("--datasets", default="all", help="comma-separated dataset ids, or all, or none")
    ap.add_argument("--layers", action="append", default=[], metavar="FAMILY=N",
                    help="another depth for one family (e.g. a compute-bound stand-in for timing)")
    ap.add_argument("--text-scale", type=float, default=1.0, help="synthetic sentences this many times longer")
    ap.add_argument("--max-rows", type=int, default=0, help="at most this many rows per dataset split")
    args = ap.parse_args(argv)
    depth = {fam: int(n) for fam, n in (item.split("=", 1) for item in args.layers)}
    TEXT_SCALE, MAX_ROWS = args.text_scale, args.max_rows
    words = lexicon()
    hub = os.path.join(args.home, "hub")
    store = os.path.join(args.home, "offlinehub-models")
    ds_cache = os.path.join(args.home, "datasets")
    os.makedirs(hub, exist_ok=True)
    report = {"models": {}, "datasets": {}, "text_scale": args.text_scale, "max_rows": args.max_rows}
    every = list(FAMILIES) + list(OTHER_FAMILIES)
    fams = [] if args.models == "none" else (every if args.models == "all" else args.models.split(","))
    for fam in fams:
        t = time.time()
        layers = depth.get(fam)
        out = os.path.join(store, f"{fam}-{layers}layers" if layers else fam)
        if not os.path.exists(os.path.join(out, "config.json")):
            os.makedirs(out, exist_ok=True)
            try:  # one family failing must not cost the others (a GPU call is scarce)
                if fam in OTHER_FAMILIES:
                    _builder(OTHER_FAMILIES[fam][0])(out, words)
                else:
                    build_model(fam, out, words, layers)
            except Exception as exc:
                shutil.rmtree(out, ignore_errors=True)
                report["models"][fam] = {"error": repr(exc)}
                print(f"offline_hub: {fam}: FAILED {exc!r}", flush=True)
                continue
        names = unsloth_aliases(OTHER_FAMILIES[fam][1] if fam in OTHER_FAMILIES else FAMILIES[fam][3])
        for name in names:
            install_repo(hub, name, out)
        report["models"][fam] = {"repo_ids": names, "seconds": round(time.time() - t, 1), "layers": layers or "default"}
        print(f"offline_hub: {fam}: {len(names)} repo ids in {time.time() - t:.1f}s", flush=True)
    every = list(DATASETS) + list(OTHER_DATASETS)
    ids = [] if args.datasets == "none" else (every if args.datasets == "all" else args.datasets.split(","))
    for ds in ids:
        build = _builder(OTHER_DATASETS[ds]) if ds in OTHER_DATASETS else lambda c, w: build_dataset(c, ds, w)
        try:
            report["datasets"][ds] = build(ds_cache, words)
        except Exception as exc:
            report["datasets"][ds] = {"error": repr(exc)}
            print(f"offline_hub: dataset {ds}: FAILED {exc!r}", flush=True)
            continue
        print(f"offline_hub: dataset {ds} -> {report['datasets'][ds]}", flush=True)
    json.dump(report, open(os.path.join(args.home, "offline_hub.json"), "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
