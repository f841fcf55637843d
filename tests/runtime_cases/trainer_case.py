"""A tiny random-weight Llama + PEFT LoRA trained by transformers.Trainer with reentrant gradient checkpointing
and ddp_find_unused_parameters left unset: transformers then passes find_unused_parameters=True to DDP, since a
PeftModel is no PreTrainedModel and its checkpointing goes unseen.

    torchrun --nproc_per_node=2 trainer_case.py nolayer OUT   # expected: "marked as ready twice"
    torchrun --nproc_per_node=2 trainer_case.py layer OUT   # the notebook's batch kept: gradient_accumulation 2 -> 1
    python trainer_case.py single OUT                        # one process, the same global batch of 4
    torchrun --nproc_per_node=2 trainer_case.py accumulate OUT   # the layer, accumulation 2 kept: DDP's reductions

Rank 0 saves the LoRA weights to OUT (torch.save) and prints `RESULT {json}`.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _layer import finish, load_layer  # noqa: E402
MODE, OUT = sys.argv[1], sys.argv[2]
if MODE in ("layer", "accumulate"):
    LAYER = load_layer()  # before transformers is imported, as in a generated script

import torch  # noqa: E402


REDUCTIONS = []


def count_reductions():
    """Every DDP model built from here on counts its gradient reductions (the calls for its first bucket)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    init = DistributedDataParallel.__init__

    def counting_init(self, *args, **kwargs):
        init(self, *args, **kwargs)

        def hook(group, bucket):
            if bucket.index() == 0:
                REDUCTIONS.append(bucket.index())
            return allreduce_hook(group, bucket)
        self.register_comm_hook(None, hook)
    DistributedDataParallel.__init__ = counting_init


def main():
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    model = LlamaForCausalLM(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    model.enable_input_require_grads()
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"],
                      lora_dropout=0.0, init_lora_weights="gaussian")
    model = get_peft_model(model, lora)
    start = {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (16, 8), generator=g)
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist(), "attention_mask": [[1] * 8] * 16})
    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(OUT) or ".", f"trainer_{MODE}"), per_device_train_batch_size=2,
        gradient_accumulation_steps=1 if MODE == "nolayer" else 2, max_steps=3, learning_rate=0.5, optim="sgd",
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=0.0,
        train_sampling_strategy="sequential", report_to=[], use_cpu=True,
        save_strategy="no", logging_steps=1, seed=0, disable_tqdm=True,
    )
    if MODE == "accumulate":
        count_reductions()
    trainer = Trainer(model=model, args=args, train_dataset=data)
    result = {"mode": MODE, "gradient_accumulation_steps": int(trainer.args.gradient_accumulation_steps),
              "world_size": int(os.environ.get("WORLD_SIZE", "1"))}
    try:
        trainer.train()
        result["outcome"] = "trains"
    except RuntimeError as exc:
        text = str(exc)
        result["outcome"] = "error: marked ready twice" if "marked as ready twice" in text else f"error: {text[:120]}"
    result["reductions"] = len(REDUCTIONS)
    result["static_graph"] = trainer.args.ddp_static_graph
    result["find_unused_parameters"] = trainer.args.ddp_find_unused_parameters
    if int(os.environ.get("RANK", "0")) == 0:
        if result["outcome"] == "trains":
            end = {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" in k}
            result["max_change"] = max((end[k] - start[k]).abs().max().item() for k in end)
            torch.save(end, OUT)
        print("RESULT " + json.dumps(result), flush=True)
        if os.environ.get("NBDDP_OUTCOME_DIR"):
            os.makedirs(os.environ["NBDDP_OUTCOME_DIR"], exist_ok=True)
            with open(os.path.join(os.environ["NBDDP_OUTCOME_DIR"], f"trainer_{MODE}.json"), "w") as fh:
                json.dump(result, fh, indent=1)
    if result["outcome"] != "trains":
        os._exit(3)  # the failed step leaves DDP's collectives half done: do not wait in teardown
    finish()


if __name__ == "__main__":
    main()
