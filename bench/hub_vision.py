"""Offline stand-ins for the vision notebook (Qwen2.5_VL_(7B)-Vision.ipynb): the model and its dataset.

offline_hub.py calls these on the GPU machine, which reaches no hub. The notebook loads
`unsloth/Qwen2.5-VL-7B-Instruct-bnb-4bit` with FastVisionModel (AutoProcessor + Qwen2_5_VLForConditionalGeneration)
and trains on `unsloth/LaTeX_OCR` through UnslothVisionDataCollator, so both must exist offline:

- build_qwen25vl: random weights at the real 7B widths but 2 text layers and 2 vision blocks, a byte-level BPE
  tokenizer trained on the spot with Qwen2-VL's special tokens (their ids written into the config), and a
  Qwen2_5_VLProcessor with a ChatML template that renders image items as <|vision_start|><|image_pad|><|vision_end|>.
  transformers 5.x builds that processor only with torchvision installed (its video processor needs it).
- build_latex_ocr: ~300 rows of small drawn images with LaTeX-like text, in the datasets-cache layout that
  `load_dataset("unsloth/LaTeX_OCR", split="train")` reads with HF_DATASETS_OFFLINE=1.
"""
from __future__ import annotations

import os
import random

import offline_hub as oh

# Qwen2.5-VL-7B-Instruct's config.json, depth cut to 2 text layers and 2 vision blocks
TEXT = dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
            num_hidden_layers=2, vocab_size=152064, max_position_embeddings=128000, rms_norm_eps=1e-6,
            use_sliding_window=False, sliding_window=32768, max_window_layers=28, rope_theta=1000000.0,
            rope_scaling={"type": "mrope", "mrope_section": [16, 24, 24]})
VISION = dict(depth=2, hidden_size=1280, out_hidden_size=3584, intermediate_size=3420, num_heads=16, in_channels=3,
              patch_size=14, spatial_merge_size=2, temporal_patch_size=2, tokens_per_second=2, window_size=112,
              fullatt_block_indexes=[1], hidden_act="silu")
PIXELS = dict(min_pixels=4 * 28 * 28, max_pixels=256 * 28 * 28)  # a 96x320 image gives 33 visual tokens


def build_qwen25vl(out_dir, words):
    from transformers import (AutoModelForImageTextToText, GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLProcessor,
                              Qwen2VLImageProcessor, Qwen2VLVideoProcessor)

    tok = oh.build_tokenizer("qwen2vl", out_dir, words)
    ids = tok.convert_tokens_to_ids
    eot = ids("<|endoftext|>")  # Qwen's bos and pad id
    special = dict(bos_token_id=eot, eos_token_id=tok.eos_token_id, pad_token_id=eot)
    config = Qwen2_5_VLConfig(text_config=dict(TEXT, **special), vision_config=VISION,
                              image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
                              vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
                              tie_word_embeddings=False)
    # the real generation_config.json: Qwen's ids and its (near-greedy) sampling defaults
    oh.save_random_model(AutoModelForImageTextToText, config, out_dir,
                         GenerationConfig(bos_token_id=eot, pad_token_id=eot, eos_token_id=[tok.eos_token_id, eot],
                                          do_sample=True, temperature=0.1, top_p=0.001, top_k=1,
                                          repetition_penalty=1.05))
    Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessor(**PIXELS), tokenizer=tok,
                        video_processor=Qwen2VLVideoProcessor(),
                        chat_template=oh.TOKENIZERS["qwen2vl"]["template"]).save_pretrained(out_dir)


def latex(rng, words):
    terms = [rng.choice(["\\frac{%s}{%s}", "%s^{%s}", "%s_{%s}", "\\sqrt{%s} %s", "\\mathrm{%s}(%s)"])
             % (rng.choice(words), rng.choice(words)) for _ in range(rng.randint(1, 4))]
    return "".join(t + rng.choice([" + ", " - ", " = ", " \\cdot "]) for t in terms[:-1]) + terms[-1]


def build_latex_ocr(cache_dir, words, rows=300, seed=0):
    """unsloth/LaTeX_OCR, split train: image (PNG bytes inside the arrow file) and the text drawn on it."""
    import datasets
    from datasets.arrow_writer import ArrowWriter
    from datasets.naming import camelcase_to_snakecase
    from PIL import Image, ImageDraw

    name = camelcase_to_snakecase("LaTeX_OCR")
    target_root = oh.dataset_root(cache_dir, "unsloth/LaTeX_OCR")
    if os.path.exists(os.path.join(target_root, "dataset_info.json")):
        return target_root
    os.makedirs(target_root, exist_ok=True)
    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")})
    rng = random.Random(f"unsloth/LaTeX_OCR/train/{seed}")
    with ArrowWriter(features=features, path=os.path.join(target_root, f"{name}-train.arrow")) as writer:
        for _ in range(rows):
            text = latex(rng, words)
            img = Image.new("RGB", (rng.randint(160, 320), rng.randint(64, 96)), "white")
            ImageDraw.Draw(img).text((4, rng.randint(4, 40)), text, fill="black")
            writer.write(features.encode_example({"image": img, "text": text}))
        count, size = writer.finalize()
    split = datasets.SplitInfo(name="train", num_bytes=size, num_examples=count, dataset_name=name)
    datasets.DatasetInfo(features=features, builder_name=name, dataset_name=name, config_name="default",
                         version="0.0.0", splits=datasets.SplitDict({"train": split}), dataset_size=size,
                         ).write_to_directory(target_root)
    return target_root
