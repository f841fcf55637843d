"""The GPU harness's CPU-checkable parts: the GRPO stand-in's short completions and the runner's scheduling.

Out of the default run (they check bench/, not the product, and take two minutes): `python -m pytest -m bench`."""
import json
import os
import signal
import subprocess
import sys

import pytest

from e2e import torchrun_launch

pytestmark = pytest.mark.bench

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench")
sys.path.insert(0, BENCH)
import offline_hub  # noqa: E402


def _completion_lengths(model, eos_id, top_k, n=48, cap=120):
    import torch

    torch.manual_seed(0)
    prompt = torch.tensor([[5, 300, 301, 302]])
    out = model.generate(prompt, do_sample=True, top_k=top_k, max_new_tokens=cap, num_return_sequences=n,
                         pad_token_id=0, eos_token_id=eos_id)[:, prompt.shape[1]:]
    lengths = []
    for row in out:
        hits = (row == eos_id).nonzero()
        lengths.append(int(hits[0]) + 1 if len(hits) else cap)
    return lengths


@pytest.mark.parametrize("top_k", [None, 50])
def test_end_generations_early_gives_short_completions(top_k):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(hidden_size=64, intermediate_size=128, num_attention_heads=2, num_key_value_heads=1,
                              head_dim=32, vocab_size=4000, num_hidden_layers=2, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    eos = 1
    before = _completion_lengths(model, eos, top_k)
    offline_hub.end_generations_early(model, eos, 20, list(range(256, 3000)))
    after = _completion_lengths(model, eos, top_k)
    assert sum(before) / len(before) > 100  # random weights: almost never EOS
    assert 8 < sum(after) / len(after) < 40  # geometric, mean about 20


def test_end_generations_early_refuses_tied_embeddings():
    pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, LlamaConfig

    model = AutoModelForCausalLM.from_config(LlamaConfig(hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                                         num_hidden_layers=1, vocab_size=500,
                                                         tie_word_embeddings=True))
    with pytest.raises(ValueError, match="untied"):
        offline_hub.end_generations_early(model, 1, 20, list(range(256, 400)))


def test_runner_ddp_then_single_slots_and_resume(tmp_path):
    scripts = tmp_path / "s"
    scripts.mkdir()
    for name in ("a", "b", "c"):
        (scripts / f"{name}.py").write_text(
            "import os\nprint({'loss': 1.5})\nprint('visible', os.environ.get('CUDA_VISIBLE_DEVICES'))\n")
    runner = [sys.executable, os.path.join(BENCH, "run_notebooks.py"), "run", "--scripts", str(scripts),
              "--work", str(tmp_path / "w"), "--only", "a,b,c", "--timeout", "120", "--deadline", "300"]
    first = tmp_path / "out1"
    subprocess.run(runner + ["--out", str(first), "--modes", "ddp"], check=True, capture_output=True)
    second = tmp_path / "out2"
    done = subprocess.run(runner + ["--out", str(second), "--resume", str(first / "notebooks.json"),
                                    "--single-slots", "2"], check=True, capture_output=True, text=True)
    assert done.stdout.count("skip ") == 3 and " ddp (limit" not in done.stdout
    results = json.load(open(second / "notebooks.json"))["notebooks"]
    assert set(results) == {"a", "b", "c"}
    for entry in results.values():
        assert entry["status"] == "ok"
        assert entry["runs"]["ddp"]["rank_exit_codes"] == {"0": 0, "1": 0}
        assert entry["runs"]["single"]["losses"] == [1.5]
    assert {entry["runs"]["single"]["gpu"] for entry in results.values()} == {0, 1}


def test_scaling_summary_pairs_each_configuration_with_its_own_round():
    import scaling

    rounds = [{"single": {"samples_per_s": 50.0, "peak_allocated_gib": {"0": 2.0}},
               "ddp": {"samples_per_s": 95.0, "peak_allocated_gib": {"0": 2.02, "1": 2.1}},
               "ddp-pcie": {"samples_per_s": 80.0, "peak_allocated_gib": {"0": 2.0, "1": 2.0}}},
              {"single": {"samples_per_s": 40.0, "peak_allocated_gib": {"0": 2.0}},
               "ddp": {"samples_per_s": 78.0, "peak_allocated_gib": {"0": 2.0, "1": 2.0}},
               "ddp-pcie": {"returncode": 1, "errors": ["boom"]}}]
    ddp = scaling.summary(rounds, "ddp")
    assert ddp["ratios"] == [1.9, 1.95] and ddp["median_ratio"] == 1.925 and ddp["min_ratio"] == 1.9
    assert ddp["max_peak_allocated_growth"] == 0.05
    assert scaling.summary(rounds, "ddp-pcie")["ratios"] == [1.6]  # a failed launch makes no pair
    assert "ratios_to_two_singles" not in ddp  # no round ran two-singles
    rounds[1]["two-singles[c2]"] = {"samples_per_s": 80.0}  # as merge names it
    assert scaling.summary(rounds, "ddp")["ratios_to_two_singles"] == [0.975]
    assert "ratios_to_two_singles" not in scaling.summary(rounds, "two-singles[c2]")
    rounds[0]["plain-torchrun"] = {"samples_per_s": 76.0}  # Unsloth's documented path, the other reference
    ddp = scaling.summary(rounds, "ddp")
    assert ddp["ratios_to_plain_torchrun"] == [1.25] and ddp["ratios_to_two_singles"] == [0.975]
    assert "ratios_to_plain_torchrun" not in scaling.summary(rounds, "plain-torchrun")
    four = {"single": {"samples_per_s": 10.0}, "ddp@01": {"samples_per_s": 19.0},  # a 4-GPU machine's round
            "two-singles@23": {"samples_per_s": 20.0}, "two-singles": {"samples_per_s": 40.0}}
    assert scaling.summary([four], "ddp@01")["ratios_to_two_singles"] == [0.95]  # two GPUs against two, not four


def test_plot_scaling_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    import plot_scaling

    result = {"model": "m", "device": "d", "rounds": [
        {"single": {"samples_per_s": 50.0}, "ddp": {"samples_per_s": 95.0}},
        {"single": {"samples_per_s": 40.0}, "ddp": {"samples_per_s": 78.0}}]}
    assert plot_scaling.rounds(result) == [{"single": 50.0, "ddp": 95.0}, {"single": 40.0, "ddp": 78.0}]
    result["rounds"][1] = {"single": {"samples_per_s": 40.0}, "ddp[c2]": {"samples_per_s": 78.0},
                           "two-singles[c2]": {"samples_per_s": 80.0}}  # a merged file's tags are dropped
    assert plot_scaling.rounds(result, ["ddp"])[1] == {"single": 40.0, "ddp": 78.0}
    plot_scaling.plot(result, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [plot_scaling.gpus_used(n, 4) for n in ("single", "ddp@23", "two-singles@01[c2]", "ddp")] == [1, 2, 2, 4]
    result["rounds"][0]["ddp@01"] = {"samples_per_s": 99.0}
    plot_scaling.plot_by_gpus(dict(result, world_size=4), tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_lockstep_paces_every_step_by_the_slowest_process():
    import scaling

    fast, slow = {"samples_per_s": 4.0, "step_s": {"0": [2.0, 2.0]}}, {"samples_per_s": 2.0, "step_s": {"0": [4.0, 4.0]}}
    steady = scaling.lockstep({"samples_per_s": 6.0, "per_process": [fast, slow]})
    assert {k: steady[k] for k in ("lockstep_to_sum", "slowest_x_n_to_sum")} == {
        "lockstep_to_sum": 0.6667, "slowest_x_n_to_sum": 0.6667}  # 2 x 8 samples per 4 s = 4/s of 6/s
    assert steady["step_cv"] == [0.0, 0.0] and steady["step_correlation_to_first"] == [None]
    jitter = [{"samples_per_s": 4.0, "step_s": {"0": [1.0, 3.0]}}, {"samples_per_s": 4.0, "step_s": {"0": [3.0, 1.0]}}]
    jittery = scaling.lockstep({"samples_per_s": 8.0, "per_process": jitter})
    assert {k: jittery[k] for k in ("lockstep_to_sum", "slowest_x_n_to_sum")} == {
        "lockstep_to_sum": 0.6667, "slowest_x_n_to_sum": 1.0}  # equal speeds, but each step waits 3 s
    assert jittery["step_cv"] == [0.5, 0.5] and jittery["step_correlation_to_first"] == [-1.0]
    assert scaling.lockstep({"samples_per_s": 4.0, "per_process": [fast]}) == {}


def test_text_scale_lengthens_every_synthetic_sentence(monkeypatch):
    import random

    words = offline_hub.lexicon()
    plain = [len(offline_hub.sentence(random.Random(s), words).split()) for s in range(50)]
    monkeypatch.setattr(offline_hub, "TEXT_SCALE", 8.0)
    long = [len(offline_hub.sentence(random.Random(s), words).split()) for s in range(50)]
    assert [round(n * 8.0) for n in plain] == long


def test_scaling_merge_tags_configurations_and_pools_nvlink_pairs(tmp_path):
    import scaling

    def result(name, rows):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"device": "d", "model": "m", "world_size": 2, "commit": name, "rounds": [
            {"single": {"samples_per_s": s}, cfg: {"samples_per_s": r}} for cfg, s, r in rows]}))
        return str(path)

    old = result("old", [("ddp", 50.0, 90.0)])
    new = result("new", [("ddp", 50.0, 100.0), ("ddp-pcie", 50.0, 80.0)])
    out = tmp_path / "merged.json"
    assert scaling.main(["merge", f"{old}=before", new, "--out", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert list(merged["configs"]) == ["ddp[before]", "ddp", "ddp-pcie"]
    assert merged["ratios"] == [1.8, 2.0] and merged["median_ratio"] == 1.9  # PCIe is reported, not pooled
    assert merged["ddp_pooled"]["ratios"] == [1.8, 2.0] and merged["configs"]["ddp"]["ratios"] == [2.0]
    assert [s["commit"] for s in merged["sources"]] == ["old", "new"]


FAKE_TRAINING = '''import os, time, types
from transformers.trainer_callback import CallbackHandler, TrainerControl, TrainerState
print("script", os.path.basename(os.path.dirname(os.path.abspath(__file__))),
      "visible", os.environ.get("CUDA_VISIBLE_DEVICES"), "extra", os.environ.get("EXTRA"), flush=True)
handler = CallbackHandler([], None, None, None, None)
world = int(os.environ.get("WORLD_SIZE", "1"))
gpus = len(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(","))
args = types.SimpleNamespace(per_device_train_batch_size=2, gradient_accumulation_steps=4, world_size=world,
                             train_batch_size=2 * (gpus if world == 1 else 1))  # as TrainingArguments has it
for _ in range(8):
    time.sleep(0.05)
    handler.on_step_end(args, TrainerState(), TrainerControl())
'''

def test_scaling_launches_each_configuration_with_its_script_and_launcher(tmp_path):
    pytest.importorskip("transformers")
    (tmp_path / "gpurun" / "plain").mkdir(parents=True)
    for script in (tmp_path / "gpurun" / "nb.py", tmp_path / "gpurun" / "plain" / "nb.py"):
        script.write_text(FAKE_TRAINING)
    out = tmp_path / "scaling.json"
    subprocess.run([sys.executable, os.path.join(BENCH, "scaling.py"), "run",
                    "--script", str(tmp_path / "gpurun" / "nb.py"),
                    "--configs", "ddp,dataparallel,plain-torchrun,two-singles", "--env", "EXTRA=1",
                    "--pairs", "2", "--skip", "2", "--run-estimate", "1", "--work", str(tmp_path / "w"),
                    "--out", str(out), "--timeout", "200"], check=True, capture_output=True)
    result = json.load(open(out))
    first, second = result["rounds"]
    assert list(first) == ["single", "ddp", "dataparallel", "plain-torchrun", "two-singles"]
    assert list(second) == ["ddp", "dataparallel", "plain-torchrun", "two-singles", "single"]  # rotated
    assert {name: run.get("samples_per_step") for name, run in first.items()} == {
        "single": 8, "ddp": 16, "dataparallel": 16, "plain-torchrun": 16, "two-singles": None}
    assert {rank: len(steps) for rank, steps in first["ddp"]["step_s"].items()} == {"0": 5, "1": 5}  # per rank
    assert first["two-singles"]["samples_per_s"] == pytest.approx(
        sum(p["samples_per_s"] for p in first["two-singles"]["per_process"]), abs=0.002)
    ddp = result["configs"]["ddp"]
    assert len(ddp["ratios"]) == 2 and len(ddp["ratios_to_two_singles"]) == len(ddp["ratios_to_plain_torchrun"]) == 2
    assert result["settings"]["env"] == {"EXTRA": "1"}
    logs = {name: (tmp_path / "w" / "pair0" / f"pair0-{name}.log").read_text() for name in first if name != "two-singles"}
    assert "script gpurun visible 0 extra 1" in logs["single"]  # the converted script on one GPU, --env passed
    assert logs["ddp"].count("script gpurun visible None") == 2  # torchrun: 2 processes
    assert "script plain visible 0,1" in logs["dataparallel"]  # one process seeing both GPUs, the plain script
    assert logs["plain-torchrun"].count("script plain visible None") == 2
    for gpu in (0, 1):  # two-singles: the converted script alone on each GPU
        assert f"script gpurun visible {gpu}" in (tmp_path / "w" / "pair0" / f"pair0-two-singles-gpu{gpu}.log").read_text()


def test_scaling_runs_the_parts_of_a_launch_at_once_on_their_own_gpus(tmp_path):
    pytest.importorskip("transformers")
    import scaling

    assert scaling.parts("ddp@01+two-singles@23") == [("ddp@01", "ddp", "01"), ("two-singles@23", "two-singles", "23")]
    assert scaling.parts("single") == [("single", "single", "0")]
    assert scaling.parts("ddp@01+single", mirror=True, total=4) == [("ddp@23", "ddp", "23"), ("single", "single", "2")]
    (tmp_path / "gpurun").mkdir()
    (tmp_path / "gpurun" / "nb.py").write_text(FAKE_TRAINING)
    out = tmp_path / "scaling.json"
    subprocess.run([sys.executable, os.path.join(BENCH, "scaling.py"), "run",
                    "--script", str(tmp_path / "gpurun" / "nb.py"), "--configs", "single,ddp@01+two-singles@23",
                    "--nproc", "4", "--swap-halves", "--pairs", "2", "--skip", "2", "--run-estimate", "1",
                    "--work", str(tmp_path / "w"), "--out", str(out), "--timeout", "200"], check=True,
                   capture_output=True)
    result = json.load(open(out))
    first, second = result["rounds"]
    assert list(first) == ["single", "ddp@01", "two-singles@23"]
    assert list(second) == ["ddp@23", "two-singles@01", "single"]  # rotated, GPU sets mirrored
    assert (first["single"]["gpus"], second["single"]["gpus"]) == ("0", "2")
    assert first["ddp@01"]["beside"] == ["two-singles@23"]
    assert first["ddp@01"]["to_beside"]["two-singles@23"] == pytest.approx(
        first["ddp@01"]["samples_per_s"] / first["two-singles@23"]["samples_per_s"], abs=1e-3)
    assert len(result["on_gpu_sets"]["ddp@2"]["to_beside"]["two-singles@2"]) == 2
    log = lambda i, name: (tmp_path / "w" / f"pair{i}" / f"pair{i}-{name}.log").read_text()  # noqa: E731
    assert log(0, "ddp@01").count("script gpurun visible 0,1") == 2  # torchrun, 2 processes on GPUs 0 and 1
    assert log(1, "ddp@23").count("script gpurun visible 2,3") == 2
    assert "script gpurun visible 2" in log(1, "single")
    assert "script gpurun visible 3" in log(0, "two-singles@23-gpu3")


def test_plain_script_is_the_notebook_without_ddp_changes():
    import ast

    import plain_script

    from conftest import need_corpus

    text = plain_script.plain_script(str(need_corpus("Kaggle-Llama3.1_(8B)-Alpaca")))
    ast.parse(text)
    assert "# %% cell 7" in text
    assert not [line for line in text.splitlines() if line.lstrip().startswith(("!", "%"))]  # no shell, no magics
    assert "NBDDP_" not in text and "nbddp_device_map" not in text and "init_process_group" not in text
    assert "trainer.train()" in text.replace("trainer_stats = ", "")


def test_launch_argv_torchrun_or_one_process():
    import run_notebooks

    env = {"OMP_NUM_THREADS": "3", "NCCL_NVLS_ENABLE": "0"}
    job, world, mode = run_notebooks.launch_argv("s.py", 2, env)
    assert job.argv == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "s.py"]
    assert job.env == {"PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0"} and (world, mode) == (2, "ddp")
    assert run_notebooks.launch_argv("s.py", 2, env, gpu="0,1")[1:] == (1, "single")
    assert run_notebooks.launch_argv("s.py", 4, env, mode="self") == (([sys.executable, "s.py"], {}), 4, "self")


def test_probe_sets_the_training_argument_levers_under_test(tmp_path):
    pytest.importorskip("transformers")
    code = ("from transformers import TrainingArguments\n"
            f"a = TrainingArguments(output_dir={str(tmp_path)!r}, use_cpu=True, report_to=[])\n"
            "print('workers', a.dataloader_num_workers)\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(BENCH, "rankprobe"), NBDDP_BENCH_PROBE_DIR=str(tmp_path / "p"),
               NBDDP_BENCH_ARGS="dataloader_num_workers=2,no_such_field=1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "workers 2" in done.stdout and "no field no_such_field" in done.stderr
    assert json.load(open(tmp_path / "p" / "rank0.json"))["bench_args"] == {"dataloader_num_workers": 2}


def test_probe_overrides_unsloth_peft_keywords(tmp_path):
    pkg = tmp_path / "fake" / "unsloth" / "models"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "llama.py").write_text("class FastLlamaModel:\n    @staticmethod\n"
                                  "    def get_peft_model(model, **k):\n        return model, k\n")
    (pkg / "loader.py").write_text("from .llama import FastLlamaModel\n\nclass FastLanguageModel(FastLlamaModel):\n"
                                   "    @staticmethod\n    def get_peft_model(model, *a, **k):\n"
                                   "        return FastLlamaModel.get_peft_model(model, *a, **k)\n")
    code = ("from unsloth.models.loader import FastLanguageModel\n"
            "print(FastLanguageModel.get_peft_model('m', r=16, use_gradient_checkpointing='unsloth'))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(BENCH, "rankprobe"), str(tmp_path / "fake")]),
               NBDDP_BENCH_PROBE_DIR=str(tmp_path / "p"), NBDDP_BENCH_PEFT="use_gradient_checkpointing=True")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "('m', {'r': 16, 'use_gradient_checkpointing': True})" in done.stdout, done.stderr
    assert json.load(open(tmp_path / "p" / "rank0.json"))["bench_peft"] == {"use_gradient_checkpointing": True}
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env=dict(env, NBDDP_BENCH_PEFT=""))
    assert "'use_gradient_checkpointing': 'unsloth'" in plain.stdout  # without the setting: as the notebook says


def test_probe_times_steps_by_cuda_events_read_after_training(tmp_path):
    pytest.importorskip("transformers")
    code = """
import types, torch
from transformers.trainer_callback import CallbackHandler, TrainerControl, TrainerState
class Event:  # a GPU clock 0.25 s ahead per recorded event, whatever the host does
    clock = [0.0]
    def __init__(self, enable_timing=False):
        self.at = None
    def record(self):
        Event.clock[0] += 0.25
        self.at = Event.clock[0]
    def elapsed_time(self, later):
        return (later.at - self.at) * 1000
synced = []
cuda = torch.cuda
cuda.is_available = cuda.is_initialized = lambda: True
cuda.synchronize = lambda: synced.append(1)
cuda.Event, cuda.memory_allocated, cuda.max_memory_allocated = Event, lambda *a: 0, lambda *a: 0
handler = CallbackHandler([], None, None, None, None)
args, state, control = types.SimpleNamespace(), TrainerState(), TrainerControl()
handler.on_train_begin(args, state, control)
for _ in range(3):
    handler.on_step_end(args, state, control)
print('syncs during training', len(synced))
"""
    env = dict(os.environ, PYTHONPATH=os.path.join(BENCH, "rankprobe"), NBDDP_BENCH_PROBE_DIR=str(tmp_path / "p"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "syncs during training 1" in done.stdout, done.stderr  # the clock's origin only
    record = json.load(open(tmp_path / "p" / "rank0.json"))
    assert record["step_timing"] == "cuda-events" and len(record["step_end_host_times"]) == 3
    ends = record["step_end_times"]
    assert [round(b - a, 3) for a, b in zip(ends, ends[1:])] == [0.25, 0.25]


def test_launch_rate_of_a_failed_launch_reports_what_it_left():
    import scaling

    failed = {"returncode": 1, "errors": ["a", "b", "OOM"], "wall_s": 9.0, "step_end_times": {"0": [1.0, 2.0]}}
    assert scaling.launch_rate(failed, 10) == {"returncode": 1, "errors": ["b", "OOM"], "wall_s": 9.0,
                                               "steps_seen": {"0": 2}}
    assert scaling.launch_rate({"concurrent": [dict(failed, returncode=0), failed]}, 10)["returncode"] == 0  # the first


def test_probe_writes_what_it_has_when_terminated(tmp_path):
    code = ("import os, signal\n"
            "child = os.fork()\n"
            "if child == 0:\n"
            "    os.kill(os.getpid(), signal.SIGTERM)\n"  # a forked worker stopped with the launch writes nothing
            "os.waitpid(child, 0)\n"
            "print('after child', os.path.exists(os.path.join(os.environ['NBDDP_BENCH_PROBE_DIR'], 'rank0.json')))\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(BENCH, "rankprobe"), NBDDP_BENCH_PROBE_DIR=str(tmp_path / "p"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 128 + signal.SIGTERM and "after child False" in done.stdout, done.stderr
    assert json.load(open(tmp_path / "p" / "rank0.json"))["terminated_by_signal"] == signal.SIGTERM


def test_launch_stopped_at_its_limit_keeps_its_ranks_steps(tmp_path):
    pytest.importorskip("transformers")
    import run_notebooks
    import scaling

    script = tmp_path / "nb.py"
    script.write_text(FAKE_TRAINING + "time.sleep(600)\n")  # 8 steps, then a hang the runner's limit ends
    r = run_notebooks.launch(str(script), str(tmp_path / "w"), str(tmp_path / "nb.log"),
                             run_notebooks.child_env({}), 30, 2)
    assert r["timed_out"] and r["returncode"] != 0
    assert {rank: p.get("terminated_by_signal") for rank, p in r["ranks"].items()} == {"0": 15, "1": 15}
    assert {rank: len(times) for rank, times in r["step_end_times"].items()} == {"0": 8, "1": 8}
    assert scaling.steady_rate(r, 2)["steps_timed"] == 5




def test_allreduce_times_the_gradients_in_ddp_buckets_under_torchrun(tmp_path):
    out = tmp_path / "ar.json"
    argv, env = torchrun_launch(os.path.join(BENCH, "allreduce.py"), 2, dict(os.environ), script_args=[
        "--numel", "1000", "--bucket-mb", "0.001", "--steps", "2", "--warmup", "1", "--dtypes", "float32", "--out", out])
    subprocess.run(argv, env=env, check=True, capture_output=True)
    result = json.loads(out.read_text())
    assert (result["world_size"], result["backend"]) == (2, "gloo")
    fp32 = result["dtypes"]["float32"]
    assert (fp32["bytes"], fp32["buckets"]) == (4000, 4)  # 1,048-byte buckets: 262, 262, 262 and 214 elements
    assert 0 < fp32["min_ms"] <= fp32["median_ms"]


def test_t4_class_summary_pairs_each_round_and_checks_the_whole_gpu_losses():
    import kaggle_t4

    def run(rnd, name, rate, losses=(12.6, 12.5), step=3.0):
        return {"gib": 15.0, "round": rnd, "run": name, "losses": list(losses),
                "rate": {"samples_per_s": rate, "median_step_s": step} if rate else {"returncode": 1}}
    runs = [dict(run(0, "one", 2.0), script_wall_s=150.0), run(0, "whole", 4.0, (12.6, 12.51), 1.5),
            dict(run(0, "self", 3.8), script_wall_s=100.0),
            run(1, "self", 4.2), run(1, "one", 2.0), run(1, "whole", 4.1, (12.6, float("nan"))),
            run(2, "one", None), run(2, "self", 4.0)]
    out = kaggle_t4.summary(runs)
    assert out["15gib-round0"]["self_over_one"] == 1.9 and out["15gib-round1"]["self_over_one"] == 2.1
    assert out["15gib-round0"]["one_wall_over_self"] == 1.5 and "one_wall_over_self" not in out["15gib-round1"]
    assert "self_over_one" not in out["15gib-round2"]  # a failed run pairs with nothing
    assert out["self_over_one_median"] == 2.0
    assert out["15gib-round0"]["one_vs_whole_losses"]["max_rel_diff"] == 0.0008
    assert out["15gib-round0"]["one_over_whole_step_s"] == [3.0, 1.5]
    assert out["15gib-round1"]["one_vs_whole_losses"]["max_rel_diff"] is None  # a NaN never matches


def test_t4_class_share_is_chosen_by_matmul_and_checked_by_losses():
    import t4_class

    def train(*losses):
        return {"train": {"losses": list(losses)}}
    assert t4_class.same_losses(train(1.0, 0.5), train(1.001, 0.5)) == (True, 0.001)
    assert t4_class.same_losses(train(1.0, 0.5), train(1.0, 0.6))[0] is False
    assert t4_class.same_losses(train(1.0, float("nan")), train(1.0, float("nan"))) == (False, None)
    assert t4_class.same_losses(train(1.0), train(1.0, 0.5)) == (False, None)
    figures = [{"sms": 4, "matmul_tflops": 20.0}, {"sms": 8, "matmul_tflops": 45.0}, {"sms": 6, "error": "x"}]
    assert t4_class.choose(figures, 32) == 8 and t4_class.choose(figures, 24) == 4
    assert t4_class.choose([{"sms": 4, "sms_reported": 8, "matmul_tflops": 55.0}], 32) == 8  # what MPS gave
    assert t4_class.mps_percent(8, 132) == "6.06" and t4_class.mps_percent(6, 132) == "4.54"  # never over N


def test_probe_green_context_keeps_one_stream_current_per_device(monkeypatch):
    import importlib.util
    import types

    spec = importlib.util.spec_from_file_location("rankprobe_site", os.path.join(BENCH, "rankprobe", "sitecustomize.py"))
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)

    class Stream:
        def __init__(self, name):
            self.name, self.waited = name, []

        def wait_stream(self, other):
            self.waited.append(other.name)
    made, state = [], {"device": 0, "current": {0: Stream("default0"), 1: Stream("default1")}}

    class Context:
        def __init__(self, device):
            self.device = device

        def Stream(self):
            made.append(self.device)
            return Stream(f"green{self.device}")
    cuda = types.SimpleNamespace(
        set_device=lambda d: state.__setitem__("device", d), current_device=lambda: state["device"],
        current_stream=lambda d: state["current"][d], set_stream=lambda s: state["current"].__setitem__(state["device"], s),
        green_contexts=types.SimpleNamespace(GreenContext=types.SimpleNamespace(
            create=lambda num_sms, device_id: Context(device_id) if num_sms == 8 else None)))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    monkeypatch.setenv("NBDDP_BENCH_GREEN_SMS", "8")
    site._green(cuda)
    cuda.set_device(0)
    green0 = state["current"][0]
    assert green0.name == "green0" and green0.waited == ["default0"]  # after the work queued before it
    cuda.set_device(0)
    assert made == [0] and state["current"][0] is green0 and green0.waited == ["default0"]
    cuda.set_device(1)
    state["current"][0] = Stream("library0")  # something made another stream current on device 0
    cuda.set_device(0)
    assert made == [0, 1] and state["current"][0] is green0 and green0.waited == ["default0", "library0"]
    assert site._COUNTS["green_sms"] == 8


def test_probe_swaps_grpo_rewards_for_one_random_weights_earn_and_records_weights_and_phases(tmp_path):
    """NBDDP_BENCH_REWARD=length: a trainer with reward functions gets the completion-length reward at train();
    the probe records the trainable weights' digest at train begin and end, the log history and the phases."""
    pytest.importorskip("transformers")
    code = ("import transformers\n"
            "class Fake(transformers.Trainer):\n"
            "    def __init__(self):\n"
            "        self.reward_funcs = [lambda completions, **k: [0.0] * len(completions)]\n"
            "t = Fake()\n"
            "try:\n    t.train()\nexcept Exception:\n    pass  # the real train() of an empty trainer\n"
            "print('rewards', t.reward_funcs[0](['ab', [{'content': 'abcd'}]]), t.reward_func_names)\n")
    env = dict(os.environ, PYTHONPATH=os.path.join(BENCH, "rankprobe"), NBDDP_BENCH_PROBE_DIR=str(tmp_path / "p"),
               NBDDP_BENCH_REWARD="length")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert "rewards [0.02, 0.04] ['length_reward']" in done.stdout, done.stderr[-3000:]
    assert json.load(open(tmp_path / "p" / "rank0.json"))["reward"] == "length"

    import importlib.util

    import torch
    spec = importlib.util.spec_from_file_location("rankprobe_site2", os.path.join(BENCH, "rankprobe", "sitecustomize.py"))
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    b.load_state_dict(a.state_dict())
    assert site._trainable(a) == site._trainable(b) and site._trainable(a)["numel"] == 8
    with torch.no_grad():
        b.weight[0, 0] += 1e-3
    assert site._trainable(a)["sha256"] != site._trainable(b)["sha256"]
