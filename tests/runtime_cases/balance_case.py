"""Samples of different lengths, 2 ranks, accumulation 2: transformers.Trainer with the runtime layer, with
length-balanced ranks (the default) or without (NBDDP_BALANCE_LENGTHS=0).

    torchrun --nproc_per_node=2 balance_case.py OUT

Every rank writes OUT.rank<r>.json: the sample ids and padded shape of each micro-batch it trained on; rank 0 also
saves the trained weights to OUT (torch.save).
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
OUT = sys.argv[1]
from _layer import finish, load_layer  # noqa: E402

LAYER = load_layer()  # before transformers is imported, as in a generated script

import torch  # noqa: E402

SEEN = []


def collate(rows):
    """Right-padding to the longest row; records what this rank trains on."""
    width = max(len(r["input_ids"]) for r in rows)
    SEEN.append({"ids": [r["idx"] for r in rows], "shape": [len(rows), width]})
    pad = [width - len(r["input_ids"]) for r in rows]
    ids = torch.tensor([r["input_ids"] + [0] * p for r, p in zip(rows, pad)])
    return {"input_ids": ids, "attention_mask": torch.tensor([[1] * len(r["input_ids"]) + [0] * p
                                                              for r, p in zip(rows, pad)]),
            "labels": torch.tensor([r["input_ids"] + [-100] * p for r, p in zip(rows, pad)])}


def main():
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(1)
    lengths = torch.randint(2, 40, (32,), generator=g).tolist()
    rows = [torch.randint(1, 64, (n,), generator=g).tolist() for n in lengths]
    data = Dataset.from_dict({"input_ids": rows, "idx": list(range(len(rows)))})
    args = TrainingArguments(
        output_dir=f"{OUT}.run", per_device_train_batch_size=2,
        gradient_accumulation_steps=2, max_steps=4, learning_rate=0.5, optim="sgd", lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=0.0, train_sampling_strategy="sequential", report_to=[],
        use_cpu=True, save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True, remove_unused_columns=False,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collate)
    trainer.train()
    rank = int(os.environ.get("RANK", "0"))
    with open(f"{OUT}.rank{rank}.json", "w") as fh:
        json.dump(SEEN, fh)
    if rank == 0:
        torch.save({k: v.detach().clone() for k, v in model.named_parameters()}, OUT)
    finish()


if __name__ == "__main__":
    main()
