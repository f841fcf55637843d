"""How a script starts: the fit decision (nbddp/runtime/fit.py) as pure functions, the switches, and the script
that launches itself (nbddp/runtime/launcher.py) as real processes on CPU: `NBDDP_NPROC=2 python train_ddp.py`."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import make_notebook
from e2e import (LAUNCHER_PROBE, AtOnce, Job, assert_adapter_saved_once, assert_clean_exit, assert_trained,
                 child_env, launcher_seen, torchrun_launch)
from nbddp import launch
from nbddp.executor import alive
from nbddp.pipeline import convert_notebook
from nbddp.runtime import fit, group, hooks, launcher

GIB = 2 ** 30
# Llama-3.1-8B's config (the fields the sizing reads)
LLAMA_8B = {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
            "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False}


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    for name in list(os.environ):
        if name.startswith("NBDDP_"):
            monkeypatch.delenv(name)
    hooks._NBDDP_SAID.clear()


@pytest.mark.parametrize("bits, low, high", [(16, 14.5, 15.5), (8, 8.0, 8.6), (4, 5.0, 5.6), (32, 29.5, 30.5)])
def test_weights_of_an_8b_model(bits, low, high):
    # 16-bit Llama-3.1-8B is 8.03e9 parameters = 14.96 GiB; 4-bit keeps the 1.05e9 embedding parameters at 16
    assert low < fit.nbddp_weight_gib(LLAMA_8B, bits) < high


def test_tied_embeddings_count_once_and_a_multimodal_config_counts_its_text_part():
    tied = {**LLAMA_8B, "tie_word_embeddings": True}
    assert fit.nbddp_weight_gib(LLAMA_8B, 16) - fit.nbddp_weight_gib(tied, 16) == pytest.approx(
        128256 * 4096 * 2 / GIB)
    assert fit.nbddp_weight_gib({"text_config": tied, "vision_config": {}}, 4) == fit.nbddp_weight_gib(tied, 4)
    moe = {**LLAMA_8B, "num_local_experts": 8, "moe_intermediate_size": 1024}
    assert fit.nbddp_weight_gib(moe, 16) < fit.nbddp_weight_gib(LLAMA_8B, 16)  # 8 experts of 1024 < one of 14336


@pytest.mark.parametrize("need, free, shard, plan", [
    (10, [15, 15], None, "ddp"),  # fits one GPU
    (19, [15, 15], None, "split"),  # fits only across both: 19 / 2 + 19 / 4 <= 15
    (7.7, [5.5, 5.5], None, "none"),  # 2 x 5.5 would hold 7.7, but not the last GPU's share (it ran out of memory)
    (7.7, [6.5, 6.5], None, "split"),  # ... and with 6.5 it trained
    (40, [15, 15], None, "none"),  # fits nowhere
    (19, [15], None, "none"),  # one GPU: nothing to split over
    (10, [], None, "ddp"),  # no GPU: nothing to decide
    # the sharded mode (`shard`: GiB on each process), where the script can load the model so
    (10, [15, 15], 8, "ddp"),  # fits one GPU: DDP first
    (19, [15, 15], 11.4, "shard"),  # not one GPU, but each process's share: every GPU computes (split: one at a time)
    (19, [15, 15], 15.5, "split"),  # the share does not fit: split as before
    (40, [15, 15], 14, "shard"),  # too big to split, its share fits
    (40, [15, 15], 21, "none"),
    (19, [15], 11.4, "none"),  # one GPU: nothing to shard over
])
def test_plan(need, free, shard, plan):
    assert fit.nbddp_plan(need, free, shard) == plan


def test_the_sharded_share_of_an_8b_model():
    """Llama-3.1-8B in 16 bits over 2 processes: its 32 layers' 6.98e9 matrix values (13.0 GiB) halved, two layers
    whole (the gather buffers), embeddings and head (1.96 GiB), LoRA r=16 on every projection (41.9 M values, 16 bytes
    each: weights, gradients, Adam's two states) and 1.5 GiB for activations: 11.4 GiB, where one GPU needs 19.4."""
    layers, outside, (count, hidden, attention, kv, mlp) = fit.nbddp_weight_gib(LLAMA_8B, 16, parts=True)
    assert (count, hidden, attention, kv, mlp) == (32, 4096, 4096, 1024, 14336)
    assert layers + outside == fit.nbddp_weight_gib(LLAMA_8B, 16)
    assert layers == pytest.approx(6.98e9 * 2 / GIB, rel=1e-3) and outside == pytest.approx(128256 * 4096 * 4 / GIB)
    adapters = 16 * 32 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 3 * (4096 + 14336)) * 16 / GIB
    assert adapters == pytest.approx(0.625)
    share = fit.nbddp_shard_gib(LLAMA_8B, 16, 2)
    assert share == pytest.approx(layers / 2 + 2 * layers / 32 + outside + adapters + 1.5)
    assert share == pytest.approx(11.39, abs=0.01) and fit.nbddp_weight_gib(LLAMA_8B, 16) * 1.2 + 1.5 > 19.4
    assert fit.nbddp_shard_gib(LLAMA_8B, 16, 4) == pytest.approx(share - layers / 4)  # a quarter each over 4
    # 4 bits: the quantization constants (1/32 of the packed bytes) stay whole on every rank
    four, _, _ = fit.nbddp_weight_gib(LLAMA_8B, 4, parts=True)
    assert fit.nbddp_shard_gib(LLAMA_8B, 4, 2) == pytest.approx(
        four / 2 + 2 * four / 32 + outside + four / 32 + adapters + 1.5)


def _fit(monkeypatch, config, free, launched=False, world=1, bits=4, shardable=None):
    """nbddp_fit on GPUs with `free` GiB; `shardable`: the sharded mode's hooks (shard_mode.py's, where the script
    carries it)."""
    monkeypatch.setattr(fit, "NBDDP_SHARDABLE", shardable or {})
    monkeypatch.setattr(fit.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fit.torch.cuda, "device_count", lambda: len(free))
    monkeypatch.setattr(fit, "_nbddp_config", lambda model: config if config else json.loads("{"))
    monkeypatch.setattr(fit, "_nbddp_free_gib", lambda launched: free[:1] if launched else free)
    monkeypatch.setattr(fit, "NBDDP_WORLD_SIZE", world)
    monkeypatch.setattr(fit, "NBDDP_IS_MAIN", True)
    monkeypatch.setattr(hooks, "NBDDP_IS_MAIN", True)
    if launched:
        monkeypatch.setenv("RANK", "0")
    return fit.nbddp_fit([("org/model", bits)])


def _shardable(config, seen, share=True):
    """Hooks as shard_mode.py gives them: its share (GiB a process over n, None where it cannot load the model so)
    and its start, both recorded in `seen`."""
    def start(models, numbers, shard):
        seen.append(("start", models, numbers, shard))
        return "shard"

    return {"share": lambda models, n: seen.append(("share", models, n)) or (
        fit.nbddp_shard_gib(config, models[0][1], n) if share else None), "start": start}


def test_fit_says_its_numbers_and_picks_ddp_or_split(monkeypatch, capsys):
    assert _fit(monkeypatch, LLAMA_8B, [15.0, 15.0]) == "ddp"
    assert "the model needs ~7.7 GiB on one GPU, 15.0/15.0 GiB free: one process per GPU" in capsys.readouterr().out
    hooks._NBDDP_SAID.clear()
    assert _fit(monkeypatch, {**LLAMA_8B, "num_hidden_layers": 120}, [15.0, 15.0]) == "split"
    assert "one process, the model split over 2 GPUs (no data parallelism" in capsys.readouterr().out


def test_fit_stops_before_loading_where_it_cannot_work(monkeypatch, capsys):
    with pytest.raises(SystemExit) as stop:
        _fit(monkeypatch, {**LLAMA_8B, "num_hidden_layers": 400}, [15.0, 15.0])
    assert stop.value.code == 1 and "it fits on no GPU, nor split over all of them" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # under torchrun a model that needs splitting cannot run
        _fit(monkeypatch, {**LLAMA_8B, "num_hidden_layers": 120}, [15.0, 15.0], launched=True, world=2)
    assert stop.value.code == 1 and "start it with `python" in capsys.readouterr().err


def test_an_unreadable_config_falls_back_to_ddp_with_a_warning(monkeypatch, capsys):
    assert _fit(monkeypatch, None, [15.0, 15.0]) == "ddp"
    assert "warning: cannot size the model (JSONDecodeError" in capsys.readouterr().out


def test_nbddp_mode_overrides(monkeypatch, capsys):
    monkeypatch.setenv("NBDDP_MODE", "ddp")
    assert _fit(monkeypatch, {**LLAMA_8B, "num_hidden_layers": 400}, [15.0, 15.0]) == "ddp"
    monkeypatch.setenv("NBDDP_MODE", "split")
    assert _fit(monkeypatch, LLAMA_8B, [15.0, 15.0]) == "split"
    assert "NBDDP_MODE=split: one process, the model split over 2 GPUs" in capsys.readouterr().out


def test_fit_picks_the_sharded_mode_where_each_process_holds_its_share(monkeypatch, capsys):
    seen = []
    assert _fit(monkeypatch, LLAMA_8B, [15.0, 15.0], bits=16, shardable=_shardable(LLAMA_8B, seen)) == "shard"
    (_, models, n), (_, _, numbers, shard) = seen
    assert models == [("org/model", 16)] and n == 2
    assert numbers == "the model needs ~19.4 GiB on one GPU, 15.0/15.0 GiB free" and shard == pytest.approx(11.39, 0.01)
    assert capsys.readouterr().out == ""  # the sharded mode's start says the line (test_shard_mode.py)
    # the share does not fit; the script cannot load the model sharded (a quantized load, files not here: share None);
    # the script does not carry the mode: split, as before
    for config, hooks_ in ((LLAMA_8B, _shardable({**LLAMA_8B, "num_hidden_layers": 96}, [])),
                           (LLAMA_8B, _shardable(LLAMA_8B, [], share=False)), (LLAMA_8B, None)):
        hooks._NBDDP_SAID.clear()
        assert _fit(monkeypatch, config, [15.0, 15.0], bits=16, shardable=hooks_) == "split"
        assert "one process, the model split over 2 GPUs" in capsys.readouterr().out
    seen.clear()  # under torchrun: this rank's GPU, the job's world size
    assert _fit(monkeypatch, LLAMA_8B, [15.0], launched=True, world=2, bits=16,
                shardable=_shardable(LLAMA_8B, seen)) == "shard"
    assert seen[0][2] == 2 and seen[1][2] == "the model needs ~19.4 GiB on one GPU, 15.0 GiB free"


def test_nbddp_mode_shard(monkeypatch, capsys):
    monkeypatch.setenv("NBDDP_MODE", "shard")
    seen = []
    assert _fit(monkeypatch, LLAMA_8B, [], bits=16, shardable=_shardable(LLAMA_8B, seen)) == "shard"
    assert seen == [("start", [("org/model", 16)], None, None)]  # asked for: no numbers of the fit check's
    with pytest.raises(SystemExit) as stop:  # a script that cannot load its model sharded
        _fit(monkeypatch, LLAMA_8B, [], bits=16)
    assert stop.value.code == 1 and capsys.readouterr().err == (
        "nbddp: error: NBDDP_MODE=shard: this script does not load its model sharded (no peft, or Unsloth): "
        "NBDDP_MODE=split\n")


def test_device_map_follows_the_mode(monkeypatch):
    assert group.nbddp_device_map("auto") == {"": group.NBDDP_DEVICE}
    monkeypatch.setattr(group, "NBDDP_MODE", "split")
    assert group.nbddp_device_map("auto") == "auto" and group.nbddp_device_map() == "balanced"


@pytest.mark.parametrize("name, value", [("NBDDP_NPROC", "0"), ("NBDDP_NPROC", "abc"), ("NBDDP_MODE", "xyz")])
def test_bad_switches_are_usage_errors(monkeypatch, capsys, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stop:
        launcher.nbddp_nproc()
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith(f"nbddp: error: {name}='{value}'")


def test_start_launches_only_a_plain_process_with_several_processes_to_run(monkeypatch):
    launched = []
    monkeypatch.setattr(group, "nbddp_self_launch", lambda nproc, mode: launched.append((nproc, mode)))
    for name in launcher.NBDDP_LAUNCHED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NBDDP_NPROC", "1")
    group.nbddp_start()
    monkeypatch.setenv("NBDDP_NPROC", "3")
    group.nbddp_start("split")  # one process holds the model
    group.nbddp_start()
    group.nbddp_start("shard")  # one process per GPU too, each holding its share of the layers
    monkeypatch.setenv("LOCAL_RANK", "0")  # under a launcher: already one of the job's processes
    group.nbddp_start()
    group.nbddp_start("shard")
    assert launched == [(3, "ddp"), (3, "shard")]


# ---- real processes: the script launches itself ----


SLEEPER = make_notebook("import os, time\nopen(f\"pid-{os.environ.get('RANK', 'plain')}-{os.getpid()}\", 'w').close()\n"
                        "time.sleep(float(os.environ.get('SLEEP', '0')))\n", LAUNCHER_PROBE)


def _sleeper(tmp_path, **env):
    (tmp_path / "train_ddp.py").write_text(convert_notebook(SLEEPER).script, encoding="utf-8")
    return {**child_env(tmp_path), **env}


def _pids(folder):
    return sorted(int(p.name.rsplit("-", 1)[1]) for p in folder.glob("pid-*"))


STARTS = [
    ({"NBDDP_NPROC": "2"}, False, ["pid-0", "pid-1"], True),  # two ranks of one job, started by the script
    ({"NBDDP_NPROC": "1"}, False, ["pid-plain"], False),  # stays one process
    ({}, False, ["pid-plain"], False),  # no GPU, no NBDDP_NPROC: one process
    ({"NBDDP_NPROC": "2"}, True, ["pid-0", "pid-1"], False),  # under torchrun: no second launch
]
BAD_SWITCHES = [("NBDDP_NPROC", "0"), ("NBDDP_NPROC", "abc"), ("NBDDP_MODE", "xyz")]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """The processes of the tests below that read no time (each test's, in its own folder), all started at once
    (e2e.AtOnce: a process importing torch leaves a core idle that another one uses): {key: (folder, argv, its
    process id, the CompletedProcess, its seconds)}; keys: ("starts", i) of STARTS, ("switch", name, value) of
    BAD_SWITCHES, ("group", i) of GROUP_CASES, "self": the example notebook as `NBDDP_NPROC=2 python train_ddp.py`."""
    import nbddp
    from tinymodels import EXAMPLE_NOTEBOOK

    runs = {}
    for i, (env, under_torchrun, _, _) in enumerate(STARTS):
        cwd = tmp_path_factory.mktemp(f"starts{i}")
        env = _sleeper(cwd, **env)
        argv, run_env = (torchrun_launch("train_ddp.py", 2, env) if under_torchrun
                         else ([sys.executable, "train_ddp.py"], env))
        runs["starts", i] = (argv, cwd, run_env)
    for name, value in BAD_SWITCHES:
        cwd = tmp_path_factory.mktemp("switch")
        runs["switch", name, value] = ([sys.executable, "train_ddp.py"], cwd, _sleeper(cwd, **{name: value}))
    for i, (cells, _) in enumerate(GROUP_CASES):
        runs["group", i] = _group_run(tmp_path_factory.mktemp(f"group{i}"), cells)
    cwd = tmp_path_factory.mktemp("self")
    (cwd / "train_ddp.py").write_text(nbddp.convert(str(EXAMPLE_NOTEBOOK)), encoding="utf-8")
    runs["self"] = ([sys.executable, "train_ddp.py"], cwd, {**child_env(cwd), "NBDDP_NPROC": "2"})
    at_once = AtOnce(runs.values(), timeout=240)
    done = at_once.done()
    return {key: (cwd, argv, proc.pid, ran, seconds) for (key, (argv, cwd, _)), proc, ran, seconds
            in zip(runs.items(), at_once.procs, done, (job.seconds for job in at_once.jobs()))}


@pytest.mark.ddp
@pytest.mark.parametrize("env, under_torchrun, files, launches", STARTS)
def test_the_script_starts_as_many_processes_as_asked(launched, env, under_torchrun, files, launches):
    tmp_path, argv, pid, job, _ = launched["starts", STARTS.index((env, under_torchrun, files, launches))]
    env = {**child_env(tmp_path), **env}  # the environment it ran with (_sleeper's), as the recipe reads it
    out, err = job.stdout, job.stderr
    assert job.returncode == 0, err[-3000:]
    assert sorted(p.name.rsplit("-", 1)[0] for p in tmp_path.glob("pid-*")) == files
    said = "nbddp: 0 GPUs: running as 2 processes (NBDDP_NPROC=1 for one)"
    assert out.count(said) == int(launches), out
    if launches:  # the script itself became torchrun (torch imported once), with nbddp's recipe: `nbddp run`'s
        seen = launcher_seen(tmp_path)
        assert seen["pid"] == pid and seen["argv"] == argv, seen["argv"]
        recipe = launch.build("train_ddp.py", 2, python=sys.executable, cpus=launch.cpu_count(), env=env)
        assert {name: seen["rank_env"].get(name) for name in recipe.env} == recipe.env
        assert seen["rank_env"]["NBDDP_MODE"] == "ddp" and seen["rank_env"]["LOCAL_WORLD_SIZE"] == "2"
        assert recipe.argv[recipe.argv.index("torch.distributed.run") + 1] == "--standalone"
        assert seen["rank_env"]["TORCHELASTIC_RUN_ID"] != "none"  # --standalone: a run id of its own


@pytest.mark.ddp
@pytest.mark.parametrize("name, value", BAD_SWITCHES)
def test_bad_switches_stop_the_script_before_anything_runs(launched, name, value):
    tmp_path, _, _, done, _ = launched["switch", name, value]
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"nbddp: error: {name}=") and not list(tmp_path.glob("pid-*"))




@pytest.mark.ddp
@pytest.mark.parametrize("how", ["SIGTERM to the script", "Ctrl-C in a terminal"])
def test_stopping_the_script_stops_every_rank(tmp_path, how):
    job = subprocess.Popen([sys.executable, "train_ddp.py"], cwd=tmp_path, start_new_session=True,
                           env=_sleeper(tmp_path, NBDDP_NPROC="2", SLEEP="300"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 90
    while len(_pids(tmp_path)) < 2 and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.2)
    ranks = _pids(tmp_path)
    assert len(ranks) == 2, f"the ranks did not start (exit {job.poll()})"
    if how == "SIGTERM to the script":
        job.send_signal(signal.SIGTERM)
    else:
        os.killpg(job.pid, signal.SIGINT)  # a terminal sends it to the whole foreground group
    assert job.wait(timeout=60) != 0
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in ranks if alive(pid)], "a rank outlived the job"


@pytest.fixture(scope="module")
def self_job(launched) -> Job:
    cwd, argv, _, done, seconds = launched["self"]
    return Job(argv, cwd, done.returncode, done.stdout, done.stderr, seconds)


@pytest.mark.ddp
def test_plain_python_trains_the_example_as_one_two_process_job(self_job):
    assert_clean_exit(self_job)
    assert self_job.count("nbddp: 0 GPUs: running as 2 processes") == 1, self_job.explain()
    assert self_job.count("nbddp: 2 processes, this one is rank 0") == 1, self_job.explain()
    assert_trained(self_job, world_size=2, per_device=1)
    assert_adapter_saved_once(self_job)


# ---- the process group is up before the notebook's first line (or right after its `import unsloth`) ----
GROUP_CELL = ("import torch, torch.distributed as dist\nt = torch.ones(1)\nif dist.is_initialized():\n"
              "    dist.all_reduce(t)\nprint('sum', t.item(), 'initialized', dist.is_initialized())\n")
FAKE_UNSLOTH = "import torch.distributed as dist\nGROUP_DURING_IMPORT = dist.is_initialized()\n"


GROUP_CASES = [
    ((GROUP_CELL,), "sum 2.0 initialized True"),
    (("import unsloth\nimport torch.distributed as dist\n"
      "print('during import', unsloth.GROUP_DURING_IMPORT, 'after', dist.is_initialized())\n", GROUP_CELL),
     "during import False after True"),
]


def _group_run(tmp_path, cells):
    """(argv, folder, environment) of a GROUP_CASES job: the notebook of `cells` under torchrun, a fake unsloth
    importable."""
    (tmp_path / "unsloth").mkdir()
    (tmp_path / "unsloth" / "__init__.py").write_text(FAKE_UNSLOTH)
    (tmp_path / "train_ddp.py").write_text(convert_notebook(make_notebook(*cells)).script, encoding="utf-8")
    argv, env = torchrun_launch("train_ddp.py", 2, {**child_env(tmp_path),
                                                    "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])})
    return argv, tmp_path, env


@pytest.mark.ddp
@pytest.mark.parametrize("cells, expected", GROUP_CASES)
def test_the_process_group_is_up_before_the_notebook_can_use_it(launched, cells, expected):
    tmp_path, _, _, done, _ = launched["group", GROUP_CASES.index((cells, expected))]
    script = (tmp_path / "train_ddp.py").read_text(encoding="utf-8")
    assert ("group=False" in script) == ("import unsloth" in cells[0])
    assert done.returncode == 0, done.stderr[-3000:]
    assert expected in done.stdout and "sum 2.0 initialized True" in done.stdout, done.stdout


class FakeNvml:
    """NVML's calls as fit.py makes them, on 2 GPUs with handles 100 and 101 (by index) or 200 (by UUID)."""

    def nvmlDeviceGetCount_v2(self, count):
        count._obj.value = 2
        return 0

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
        handle._obj.value = 100 + index.value
        return 0 if index.value < 2 else 1

    def nvmlDeviceGetHandleByUUID(self, uuid, handle):
        handle._obj.value = 200
        return 0 if uuid == b"GPU-1a2b" else 1


@pytest.mark.parametrize("visible, order, handles", [
    (None, None, [100, 101]),            # every GPU
    ("1,0", None, [101, 100]),           # every GPU, in another order: the same set, whatever CUDA's order
    ("1", None, None),                   # a subset in CUDA's own order (fastest first): NVML's index may differ
    ("1", "PCI_BUS_ID", [101]),          # the same order as NVML's
    ("GPU-1a2b", None, [200]),           # by UUID
    ("GPU-ffff", None, None),            # a UUID NVML does not know
    ("MIG-3c4d", None, None),            # a MIG instance: CUDA is asked instead
])
def test_free_memory_comes_from_nvml_only_where_its_gpus_are_cudas(monkeypatch, visible, order, handles):
    for name, value in (("CUDA_VISIBLE_DEVICES", visible), ("CUDA_DEVICE_ORDER", order)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    found = fit._nbddp_nvml_handles(FakeNvml())
    assert (None if found is None else [h.value for h in found]) == handles
