"""What a script guarantees, under 2 real ranks (torchrun --nproc_per_node=2, gloo), with the whole runtime loaded as
a script carries it. The test makes the group's timeout short (NBDDP_GROUP_TIMEOUT), standing in for NCCL's.

    torchrun --nproc_per_node=2 guarantees_case.py ok OUT     # stdin: an open pipe nobody writes
    torchrun --nproc_per_node=2 guarantees_case.py fail OUT   # stdin closed; rank 0 raises during its save

`ok`: a rank-0-only save that outlasts the group's timeout, then nbddp_barrier; a save inside an imported module
made on both ranks (rank 0 comes late to it); a Trainer run; a loop of the case's own that makes the ranks diverge;
input(); the end of a script (nbddp_teardown). Each rank writes OUT/rank<R>.json with what it saw, and the files
each rank opened for writing under OUT (an audit hook: the oracle is Python's own record of opens).
`fail`: input(), then rank 0 raises inside its save block while rank 1 waits at nbddp_barrier.
"""
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _layer import finish, load_layer  # noqa: E402

MODE, OUT = sys.argv[1], os.path.abspath(sys.argv[2])
SLOW = float(os.environ.get("CASE_SLOW", "12"))  # seconds of rank-0 work
L = load_layer()
WRITES = []


def audit(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].startswith(OUT + os.sep):
        mode, flags = args[1], args[2]
        if (mode and any(c in mode for c in "wax+")) or (mode is None and flags & (os.O_WRONLY | os.O_RDWR)):
            WRITES.append(os.path.relpath(args[0], OUT))


sys.addaudithook(audit)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def ask():
    try:
        return "answer: " + input("Continue? ")
    except EOFError as exc:
        return f"EOFError: {exc}"


def ok(seen):
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
    from datasets import Dataset

    L.nbddp_dist()
    rank = dist.get_rank()
    seen["group_timeout_s"] = dist.group.WORLD._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16))
    start = time.monotonic()
    if L.NBDDP_IS_MAIN:  # the converter's guard: rank 0 works longer than the group's timeout
        time.sleep(SLOW)
        model.save_pretrained(os.path.join(OUT, "guarded"))
    L.nbddp_barrier("save_pretrained")
    seen["barrier_s"] = time.monotonic() - start

    import guarantee_saver  # a save the converter cannot see, made on every rank
    if rank == 0:
        time.sleep(2)  # rank 0 comes late: another rank must not go on before the folder is whole
    guarantee_saver.save(model, os.path.join(OUT, "imported"))
    seen["imported_whole_after_call"] = os.path.exists(os.path.join(OUT, "imported", "config.json"))

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 32, (8, 6), generator=g).tolist()
    data = Dataset.from_dict({"input_ids": ids, "labels": ids, "attention_mask": [[1] * 6] * 8})
    args = TrainingArguments(output_dir=os.path.join(OUT, "trainer"), per_device_train_batch_size=2, max_steps=2,
                             learning_rate=0.1, optim="sgd", report_to=[], use_cpu=True, save_strategy="no",
                             disable_tqdm=True, seed=0, ddp_find_unused_parameters=False)
    Trainer(model=model, args=args, train_dataset=data).train()

    torch.manual_seed(0)
    own = torch.nn.Linear(4, 2)  # a loop of its own on each rank, on data that differs by rank: no DDP
    optimizer = torch.optim.SGD(own.parameters(), lr=0.1)
    own(torch.full((3, 4), float(rank + 1))).sum().backward()
    optimizer.step()

    seen["input"] = ask()
    L.nbddp_teardown()


def fail(seen):
    L.nbddp_dist()
    seen["input"] = ask()
    with open(os.path.join(OUT, f"rank{L.NBDDP_RANK}.json"), "w") as fh:
        json.dump(seen, fh)
    try:  # as a script runs its cells
        if L.NBDDP_IS_MAIN:
            time.sleep(SLOW)
            print(f"CASE rank 0 raises at {time.time()}", flush=True)
            raise RuntimeError("rank 0 failed during its save (test)")
        L.nbddp_barrier("save_pretrained_gguf")
    finally:
        L.nbddp_teardown()


if __name__ == "__main__":
    result = {}
    if MODE == "fail":
        fail(result)
    else:
        ok(result)
        result["writes"] = WRITES
        with open(os.path.join(OUT, f"rank{L.NBDDP_RANK}.json"), "w") as fh:
            json.dump(result, fh)
        finish()
