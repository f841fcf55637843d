"""Hugging Face's Trainer trains a sharded model as it trains a whole one (nbddp/runtime/shard.py, shard_load.py,
docs/sharded.md): a tiny random-weight Llama saved by `save_pretrained`, loaded into the sharded mode on 2 gloo ranks
with LoRA added by `prepare` (peft), trained by `transformers.Trainer` for 3 steps (gradient checkpointing, its
logging) against the same model loaded whole by `from_pretrained` and trained by the Trainer in one process at the
same global batch: the loss of each step and the adapters after training equal, with the all-gather and with the
host copies (there after a forward pass on rank 0 alone, which leaves layers whole on rank 0 only). The Trainer's
own DDP wrap (accelerate's, of the peft model it is given) leaves the sharded parameters out, by the names
`nbddp_shard_model` gave it; `trainer.save_model()` writes the adapter on rank 0 alone, the trained tensors, and
rank 0's `model.save_pretrained()` the same.

This file is also the case each run executes: `python test_shard_trainer.py whole ROOT` (one process) and, under
torchrun, `python test_shard_trainer.py sharded ROOT [no-ignore]`; the test starts both at once and compares the
JSON each writes (the test's own process imports no torch). `no-ignore` takes the names off the model before the
Trainer wraps it: DDP's start-up broadcast then sends rank 0's whole layers where rank 1 holds none, and the
host-copy run fails (gloo: "Received data size doesn't match expected size")."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zlib

import pytest

pytestmark = pytest.mark.ddp
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAYERS, VOCAB, SEQ, STEPS, GLOBAL_BATCH = 3, 96, 16, 3, 4


def runs(root, *sharded_args):
    """Both runs started at once (output to files: no run waits on a full pipe); for each, (return code, its
    output, its JSON or None)."""
    from e2e import torchrun_launch
    me = os.path.abspath(__file__)
    argv, env = torchrun_launch(me, 2, dict(os.environ), script_args=["sharded", str(root), *sharded_args])
    jobs = [(argv, env, "sharded"), ([sys.executable, me, "whole", str(root)], dict(os.environ), "whole")]
    procs = []
    try:
        for job_argv, job_env, name in jobs:
            log = open(os.path.join(root, f"{name}.log"), "w+")
            procs.append((subprocess.Popen(job_argv, cwd=ROOT, env=job_env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True), log, name))
        out = []
        for proc, log, name in procs:
            rc = proc.wait(timeout=240)
            log.seek(0)
            path = os.path.join(root, f"{name}.json")
            out.append((rc, log.read(), json.load(open(path)) if rc == 0 and os.path.exists(path) else None))
        return out
    finally:
        for proc, log, _ in procs:
            if proc.poll() is None:  # the launcher and its ranks
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()


def test_the_trainer_trains_a_sharded_model_as_one_process_trains_the_whole_one(tmp_path):
    (rc, log, sharded), (rc_whole, log_whole, whole) = runs(tmp_path)
    assert rc_whole == 0 and whole, log_whole[-3000:]
    assert rc == 0 and sharded, log[-3000:]
    for transport, got in sharded.items():
        assert len(got["losses"]) == len(whole["losses"]) == STEPS, transport
        for a, b in zip(got["losses"], whole["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b), (transport, got["losses"], whole["losses"])
        assert got["logged_steps"] == whole["logged_steps"] == list(range(1, STEPS + 1))  # the Trainer's logging
        assert got["callback_steps"] == 2 * whole["callback_steps"] == 2 * [list(range(1, STEPS + 1))]  # each rank
        assert sorted(got["adapters"]) == sorted(whole["adapters"]) and got["adapters"], transport
        for name, values in whole["adapters"].items():
            assert max(abs(x - y) for x, y in zip(got["adapters"][name], values)) < 1e-5, (transport, name)
            assert got["moved"][name], (transport, name)  # every adapter trained
        # the Trainer's DDP (accelerate's wrap of the peft model it was given) leaves the sharded parameters alone
        assert got["ddp"] == {"wrapped": True, "ignores_the_sharded": True}, transport
        assert got["frozen_sharded"] == LAYERS * 9, transport  # 7 projections and 2 norms a layer
        assert got["gathers"] > 0 and got["most_blocks_whole"] <= 2, (transport, got)
        # saved once, by rank 0, the trained tensors; model.save_pretrained() on rank 0 the same
        assert got["saved_by_rank"] == [True, False], (transport, got["saved_by_rank"])
        assert got["saved_equal_trained"] and got["save_pretrained_equal"], (transport, got)
        assert got["saved_keys"] == whole["saved_keys"] and all(".lora_" in k for k in got["saved_keys"]), transport


# ---------------------------------------------------------------- each run (this file as a script)

def save_checkpoint(folder):
    from test_shard_load import save_checkpoint as save  # the same tiny Llama (LAYERS and VOCAB are this file's too)
    save(folder)


def with_lora(model):
    import peft
    return peft.get_peft_model(model, peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))


def set_adapters(model):
    """Every adapter weight from a generator its name seeds (the same in both runs, B not zero)."""
    import torch
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.requires_grad:
                gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                param.copy_(0.05 * torch.randn(param.shape, generator=gen))


def dataset():
    import torch
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, VOCAB, (STEPS * GLOBAL_BATCH, SEQ), generator=gen)
    return [{"input_ids": row, "labels": row, "attention_mask": torch.ones_like(row)} for row in ids]


def train(model, out, batch):
    """The Trainer as a notebook makes it, with a callback of its own; returns (trainer, [per step: summed token
    loss, tokens] of this process, found by a hook on the model's output, the steps the callback saw end)."""
    import torch
    import transformers
    seen, ended = [], []

    class Steps(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            ended.append(state.global_step)

    def hook(module, args, kwargs, output):
        logits, labels = output.logits[:, :-1].double(), kwargs["labels"][:, 1:]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="sum")
        seen.append([loss.item(), labels.numel()])

    model.register_forward_hook(hook, with_kwargs=True)
    args = transformers.TrainingArguments(
        output_dir=out, per_device_train_batch_size=batch, max_steps=STEPS, learning_rate=1e-2, logging_steps=1,
        save_strategy="no", report_to="none", seed=0, use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
        gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False})
    trainer = transformers.Trainer(model=model, args=args, train_dataset=dataset(), callbacks=[Steps()])
    trainer.train()
    return trainer, seen, ended


def saved(folder):
    from safetensors.torch import load_file
    path = os.path.join(folder, "adapter_model.safetensors")
    return load_file(path) if os.path.exists(path) else None


def equal_to_trained(files, model):
    trained = {n.replace(".default", ""): p.detach() for n, p in model.named_parameters() if p.requires_grad}
    import torch
    return files is not None and sorted(files) == sorted(trained) and all(
        torch.equal(files[k], trained[k]) for k in files)


def whole(root):
    import transformers
    folder = os.path.join(root, "checkpoint-whole")
    save_checkpoint(folder)
    model = with_lora(transformers.AutoModelForCausalLM.from_pretrained(folder))
    set_adapters(model)
    trainer, seen, ended = train(model, os.path.join(root, "out-whole"), GLOBAL_BATCH)
    trainer.save_model(os.path.join(root, "save-whole"))
    files = saved(os.path.join(root, "save-whole"))
    result = {"losses": [s / n for s, n in seen], "adapters": adapters(model), "saved_keys": sorted(files),
              "callback_steps": [ended],
              "logged_steps": [e["step"] for e in trainer.state.log_history if "loss" in e]}
    with open(os.path.join(root, "whole.json"), "w") as fh:
        json.dump(result, fh)


def adapters(model):
    return {n: p.detach().reshape(-1).tolist() for n, p in model.named_parameters() if p.requires_grad}


def sharded(root, no_ignore=False):
    """Both transports in turn, each a fresh load and Trainer; rank 0 writes {transport: result}."""
    sys.path.insert(0, ROOT)
    import torch.distributed as dist
    dist.init_process_group("gloo")
    folder = os.path.join(root, "checkpoint-sharded")
    if dist.get_rank() == 0:
        save_checkpoint(folder)
    dist.barrier()
    result = {transport: sharded_run(root, folder, transport, no_ignore) for transport in ("collective", "host")}
    if dist.get_rank() == 0:
        with open(os.path.join(root, "sharded.json"), "w") as fh:
            json.dump(result, fh)
    from runtime_cases._layer import finish
    finish()  # and leave at once: Python's own exit can abort in gloo's teardown (finish says why)


def sharded_run(root, folder, transport, no_ignore):
    import torch
    import torch.distributed as dist

    from nbddp.runtime.shard_load import nbddp_load_sharded
    rank, world = dist.get_rank(), dist.get_world_size()
    model, shards = nbddp_load_sharded(folder, prepare=with_lora, timing=True, transport=transport)
    set_adapters(model)
    if no_ignore:  # the sharded parameters' names as if never given to DDP
        model.__dict__.pop("_ddp_params_and_buffers_to_ignore", None)
    if rank == 0 and transport == "host":  # a notebook's look at the model before training, on rank 0 alone (the
        with torch.no_grad():              # host copies need no other rank): its last two layers stay whole there
            model.eval()(input_ids=dataset()[0]["input_ids"][None])
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    whole_at_once = []
    for block in (b for b in model.modules() if isinstance(b, torch.nn.ModuleList)):
        for layer in block:
            layer.register_forward_pre_hook(lambda *_: whole_at_once.append(len(shards.whole_blocks())))
    out = os.path.join(root, transport)
    trainer, seen, ended = train(model, os.path.join(out, "trainer"), GLOBAL_BATCH // world)
    timing = shards.take_timing()
    ddp = trainer.model_wrapped
    left_to_ranks = set(getattr(ddp, "parameters_to_ignore", ()))
    trainer.save_model(os.path.join(out, f"save-rank{rank}"))
    if rank == 0:
        model.save_pretrained(os.path.join(out, "save-pretrained"))
    dist.barrier()
    sums = torch.tensor(seen, dtype=torch.float64)
    dist.all_reduce(sums)
    every = [None] * world
    dist.all_gather_object(every, (os.path.exists(os.path.join(out, f"save-rank{rank}", "adapter_model.safetensors")),
                                   ended))
    if rank != 0:
        return None
    files, again = saved(os.path.join(out, "save-rank0")), saved(os.path.join(out, "save-pretrained"))
    return {
        "losses": (sums[:, 0] / sums[:, 1]).tolist(), "adapters": adapters(model),
        "moved": {n: not torch.equal(p.detach(), start[n]) for n, p in model.named_parameters() if p.requires_grad},
        "logged_steps": [e["step"] for e in trainer.state.log_history if "loss" in e],
        "ddp": {"wrapped": isinstance(ddp, torch.nn.parallel.DistributedDataParallel),
                "ignores_the_sharded": left_to_ranks == set(shards.ignored) != set()},
        "frozen_sharded": len(shards.ignored), "gathers": timing["gathers"],
        "most_blocks_whole": max(whole_at_once), "saved_by_rank": [e[0] for e in every],
        "callback_steps": [e[1] for e in every], "saved_keys": sorted(files or {}),
        "saved_equal_trained": equal_to_trained(files, model),
        "save_pretrained_equal": again is not None and files is not None and sorted(again) == sorted(files)
        and all(torch.equal(again[k], files[k]) for k in files)}


if __name__ == "__main__":
    {"whole": lambda: whole(sys.argv[2]),
     "sharded": lambda: sharded(sys.argv[2], no_ignore="no-ignore" in sys.argv[3:])}[sys.argv[1]]()
