"""End to end on CPU: GRPO trains under DDP, shown with a real signal (issue 41, item 1, CPU part). A notebook of
ours in the style of Unsloth's GRPO notebooks with plain TRL (no Unsloth, no vLLM), converted by nbddp and run as one
2-process torchrun job (gloo), every rank's output shown (--tee=3).

The notebook: a tiny random-weight Llama (tinymodels), a LoRA by peft, a dozen prompts, two reward functions random
weights earn unevenly (the completion's length in characters, its count of "e": the rewards of a prompt's
completions differ, so the advantages are not zero), GRPOConfig + GRPOTrainer(...).train(), the adapter saved with
model.save_pretrained("grpo_lora").

Why num_iterations = 2: TRL's loss is computed at the ratio new/old policy = 1 on a batch's first pass, and with
loss_type "dapo" it is then -sum(advantage x completion length) / tokens. A random model never emits EOS, so every
completion is max_completion_length long and the advantages of a group (mean-subtracted) sum to 0: the logged loss is
exactly 0 whatever the rewards. On the second pass over the same batch (mu = 2 in the GRPO paper) the ratio is no
longer 1 wherever the first update moved the LoRA, and the loss is non-zero only if the advantages were. With a
constant reward the advantages, gradients and every logged loss are 0 (how this test was shown to fail).

What the notebook records: each rank, inside the notebook's own training function (what names the rank runs on every
rank), a digest of its LoRA tensors in lora-rank<R>.json; after training (rank 0 alone), the trainer's
log_history and the writer's RANK appended to log_history.jsonl, and which LoRA tensors moved from their values before
training in moved.json.
"""
from __future__ import annotations

import ast
import json
import re

import pytest

from e2e import assert_clean_exit, notebook_job, run_jobs
from tinymodels import save_tiny_llama

pytestmark = pytest.mark.ddp

MAX_STEPS = 4
PROMPTS = ["Name a primary color.", "Translate to French.", "What is the capital of France?", "Add two numbers.",
           "Give an antonym.", "Sort the numbers.", "Name a planet.", "Convert to uppercase.", "Say hello.",
           "Count to three.", "Name a fruit.", "Spell a word."]

REWARDS = (
    "def length_reward(completions, **kwargs):\n    return [float(len(c)) for c in completions]\n"
    "def e_reward(completions, **kwargs):\n    return [float(c.count('e')) for c in completions]\n"
    "reward_funcs = [length_reward, e_reward]\n")
CONSTANT_REWARD = (  # what proves the test can fail: every advantage is 0
    "def constant_reward(completions, **kwargs):\n    return [1.0 for c in completions]\n"
    "reward_funcs = [constant_reward]\n")
# valid on 1 process (2 % (2 x 1) == 0), not on 2 (2 % (2 x 2) != 0): TRL's GRPOConfig refuses it on every rank
BREAKS_ON_2 = "generation_batch_size = 2, "


def grpo_cells(rewards: str = REWARDS, extra: str = "") -> list[str]:
    """The notebook's code cells; `extra`: more GRPOConfig arguments ("name = value, ")."""
    return [
        "import json, os, hashlib\nimport torch\nfrom datasets import Dataset\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "from peft import LoraConfig, get_peft_model\nfrom trl import GRPOConfig, GRPOTrainer\n",
        "model = AutoModelForCausalLM.from_pretrained('tiny-llama')\n"
        "tokenizer = AutoTokenizer.from_pretrained('tiny-llama')\n",
        "model = get_peft_model(model, LoraConfig(r = 8, lora_alpha = 16, lora_dropout = 0, task_type = 'CAUSAL_LM',\n"
        "    target_modules = ['q_proj', 'k_proj', 'v_proj', 'o_proj']))\n"
        "def lora_weights():\n"
        "    return {k: v.detach().clone() for k, v in model.named_parameters() if 'lora_' in k}\n"
        "initial = lora_weights()\n",
        f"dataset = Dataset.from_dict({{'prompt': {PROMPTS!r}}})\n",
        rewards,
        "training_args = GRPOConfig(output_dir = 'outputs', learning_rate = 5e-3, per_device_train_batch_size = 2,\n"
        "    gradient_accumulation_steps = 1, num_generations = 2, max_completion_length = 8, num_iterations = 2,\n"
        f"    {extra}max_steps = {MAX_STEPS}, logging_steps = 1, save_strategy = 'no', report_to = 'none',\n"
        "    use_cpu = True, seed = 3407)\n"
        "trainer = GRPOTrainer(model = model, processing_class = tokenizer, reward_funcs = reward_funcs,\n"
        "                      args = training_args, train_dataset = dataset)\n",
        "def train_and_record():\n"
        "    stats = trainer.train()\n"
        "    digest = {k: hashlib.sha256(v.float().numpy().tobytes()).hexdigest() for k, v in lora_weights().items()}\n"
        "    with open(f\"lora-rank{os.environ.get('RANK', '0')}.json\", 'w') as fh:\n"
        "        json.dump(digest, fh)\n"
        "    return stats\n",
        "trainer_stats = train_and_record()\n",
        "with open('log_history.jsonl', 'a') as fh:\n"
        "    fh.write(json.dumps({'rank': os.environ.get('RANK'), 'log_history': trainer.state.log_history}) + '\\n')\n"
        "final = lora_weights()\n"
        "moved = sorted(k for k in initial if not torch.equal(initial[k], final[k]))\n"
        "with open('moved.json', 'w') as fh:\n    json.dump({'moved': moved, 'of': sorted(initial)}, fh)\n",
        "model.save_pretrained('grpo_lora')\n",
    ]


def printed_logs(job) -> list[tuple[str, dict]]:
    """(the rank's --tee prefix, the dict) of every Trainer log line printed with a 'loss'."""
    found = []
    for line in job.stdout.replace("\r", "\n").splitlines():
        match = re.match(r"\s*(\[\w+\]:)?\s*(\{'loss'.*\})\s*$", line)
        if match:
            found.append((match.group(1) or "", ast.literal_eval(match.group(2))))
    return found


def history(job) -> list[dict]:
    """The lines of log_history.jsonl, each {'rank': RANK of the writer, 'log_history': [...]}."""
    path = job.cwd / "log_history.jsonl"
    assert path.is_file(), "the notebook's last cells did not write log_history.jsonl\n" + job.explain()
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def step_logs(job) -> list[dict]:
    return [log for log in history(job)[0]["log_history"] if "loss" in log]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """The notebook's job, and the one of test_a_generation_batch_valid_on_1_process_stays_valid_on_2_...: both at
    once, each in its own folder (e2e.run_jobs; neither reads time)."""
    started = []
    for name, extra in (("grpo", ""), ("batch", BREAKS_ON_2)):
        save_tiny_llama((cwd := tmp_path_factory.mktemp(name)) / "tiny-llama")
        started.append(notebook_job(grpo_cells(REWARDS, extra), cwd)[0])
    return run_jobs(started, timeout=240)


@pytest.fixture(scope="module")
def job(jobs):
    return jobs[0]


def test_the_grpo_job_ends_with_status_0(job):
    assert job.returncode == 0, "the 2-rank GRPO job failed\n" + job.explain()
    assert_clean_exit(job)
    assert job.count("nbddp: 2 processes, this one is rank 0") == 1, job.explain()


def test_the_log_history_is_written_once_by_rank_0(job):
    written = history(job)
    assert [entry["rank"] for entry in written] == ["0"], (
        f"log_history.jsonl should have one line, from RANK 0 (the notebook's end runs on rank 0 alone): "
        f"{[entry['rank'] for entry in written]}\n" + job.explain())
    assert len(step_logs(job)) == MAX_STEPS, f"expected {MAX_STEPS} step logs in log_history: {step_logs(job)}"


def test_a_logged_loss_is_not_zero(job):
    losses = [log["loss"] for log in step_logs(job)]
    assert any(loss != 0 for loss in losses), (
        f"every logged GRPO loss is 0 ({losses}): the advantages were all zero or the policy never moved between "
        "the two passes over a batch (num_iterations = 2)\n" + job.explain())


def test_the_rewards_differ_within_groups_and_give_gradients(job):
    logs = step_logs(job)
    scored = [log for log in logs if "reward_std" in log]  # the steps that generated (every num_iterations-th)
    assert len(scored) == MAX_STEPS // 2 and all(log["reward_std"] > 0 for log in scored), (
        f"the rewards of a prompt's completions should differ (reward_std > 0) at every generation: {scored}")
    assert all(log["grad_norm"] > 0 for log in logs), f"a step had no gradient: {[log['grad_norm'] for log in logs]}"


def test_the_step_logs_and_rewards_are_printed_once_by_rank_0(job):
    printed = printed_logs(job)
    assert len(printed) == MAX_STEPS, (
        f"expected {MAX_STEPS} printed step logs, one per step, once per job (not once per rank): {len(printed)}\n"
        + job.explain())
    assert {prefix for prefix, _ in printed} == {"[default0]:"}, (
        f"step logs printed by other ranks than 0: {[prefix for prefix, _ in printed]}\n" + job.explain())
    rewarded = [log for _, log in printed if "reward_std" in log and any(k.startswith("rewards/") for k in log)]
    assert len(rewarded) == MAX_STEPS // 2, f"the rewards of each generation should be printed once: {printed}"
    logged = [float(log["loss"]) for log in step_logs(job)]
    assert [float(log["loss"]) for _, log in printed] == pytest.approx(logged, rel=1e-3, abs=1e-6), (
        "the printed losses are not the log history's")


def test_the_lora_weights_moved(job):
    moved = json.loads((job.cwd / "moved.json").read_text())
    assert len(moved["of"]) == 16, moved  # 2 layers x q, k, v, o x lora_A, lora_B
    assert moved["moved"] == moved["of"], (
        f"LoRA tensors still at their values from before training: {sorted(set(moved['of']) - set(moved['moved']))}")


def test_every_rank_holds_the_same_lora_weights(job):
    first, second = (json.loads(path.read_text()) if path.is_file() else None
                     for path in (job.cwd / f"lora-rank{rank}.json" for rank in range(2)))
    assert first is not None and second is not None, (
        f"each rank should write lora-rank<R>.json from the notebook's training function: rank 0 "
        f"{'wrote' if first else 'did not'}, rank 1 {'wrote' if second else 'did not'}\n" + job.explain())
    assert first == second, f"ranks 0 and 1 hold different LoRA weights: {set(first.items()) ^ set(second.items())}"
    assert len(first) == 16, first
    assert job.count("nbddp: ranks agree after train(): all 2 hold the same weights "
                     "(7,168 trained values in 16 tensors)") == 1, job.explain()


def test_the_adapter_is_saved_once_like_the_notebooks_do(job):
    saved = job.cwd / "grpo_lora"
    assert (saved / "adapter_config.json").is_file() and (saved / "adapter_model.safetensors").is_file(), (
        "model.save_pretrained('grpo_lora') did not write the adapter\n" + job.explain())
    assert job.count("saved by rank 0, once: grpo_lora (save_pretrained)") == 1, job.explain()


def test_a_generation_batch_valid_on_1_process_stays_valid_on_2_as_the_batch_is_split(jobs):
    """generation_batch_size 2 = per_device_train_batch_size 2 x 1 process: valid alone; on 2 ranks each takes 1 of
    the notebook's 2 (the accumulation, 1, does not divide), so the global batch stays 2 and TRL accepts it (DDP's own
    batch, 2 x 2 = 4, would make TRL stop the job: `generation_batch_size (2) must be divisible by the global batch
    size (4)`)."""
    done = jobs[1]  # the notebook with BREAKS_ON_2
    assert_clean_exit(done)
    assert done.count("nbddp: 2 processes keep the notebook's batch of 2: per_device_train_batch_size 2 -> 1 per "
                      "rank") == 1, done.explain()
