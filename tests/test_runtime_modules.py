"""Each module of nbddp/runtime/ imported and called directly, one process (the multi-process runs of the whole
runtime, as scripts carry it, are in test_runtime_ddp.py)."""
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import types

import pytest
import torch

from nbddp.runtime import (agree, ask, balance, checkpoint, file_races, files, global_batch, group, hooks, lean_sync, loop,
                           one_writer, peft_shim, strategy, tiled_mlp, wait, xformers_shim)

CASES = os.path.join(os.path.dirname(__file__), "runtime_cases")


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    """No NBDDP_*/UNSLOTH_* switch from outside, one process on rank 0, every message said anew."""
    for name in list(os.environ):
        if name.startswith(("NBDDP_", "UNSLOTH_")):
            monkeypatch.delenv(name)
    monkeypatch.setattr(hooks, "NBDDP_IS_MAIN", True)
    hooks._NBDDP_SAID.clear()


def world(monkeypatch, size, *modules):
    for module in modules:
        monkeypatch.setattr(module, "NBDDP_WORLD_SIZE", size)


def test_importing_the_runtime_imports_no_training_library():
    code = ("import sys, nbddp.runtime.group, nbddp.runtime.hooks, nbddp.runtime.strategy, nbddp.runtime.balance, "
            "nbddp.runtime.lean_sync, nbddp.runtime.tiled_mlp, nbddp.runtime.peft_shim, nbddp.runtime.xformers_shim, "
            "nbddp.runtime.one_writer, nbddp.runtime.agree, nbddp.runtime.ask; "
            "print([m for m in ('transformers', 'trl', 'peft', 'unsloth', 'accelerate') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    bare = subprocess.run([sys.executable, "-c", "import sys, nbddp.runtime; print('torch' in sys.modules)"],
                          capture_output=True, text=True, check=True).stdout
    assert bare.strip() == "False"  # the package itself imports none of its modules


def test_no_two_runtime_modules_define_one_name():
    """A script carries its runtime modules inlined into one namespace: a name two modules define is the later one's
    in both (split mode's placement once read agree's dict as a byte count)."""
    import ast

    from nbddp.runtime import MODULES
    where = {}
    for module in MODULES:
        with open(os.path.join(os.path.dirname(agree.__file__), f"{module}.py"), encoding="utf-8") as source:
            for node in ast.parse(source.read()).body:
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                names = [node.name] if hasattr(node, "name") else [t.id for t in targets if isinstance(t, ast.Name)]
                for name in names:
                    assert where.setdefault(name, module) == module, f"{name}: {where[name]} and {module}"


def test_group_one_process_on_the_cpu(monkeypatch):
    assert group.nbddp_device_map() == {"": group.NBDDP_DEVICE}
    assert group.nbddp_dist() is False and group.NBDDP_IS_MAIN
    group.nbddp_barrier()  # one process: nothing to wait for
    group.nbddp_teardown()


def test_group_start_says_how_the_job_runs(monkeypatch, capsys):
    monkeypatch.setattr(os, "environ", dict(os.environ))  # what the start sets stays in this test
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    c10d = torch.distributed.distributed_c10d
    for module, name in ((c10d, "init_process_group"), (c10d, "destroy_process_group"),
                         (torch.distributed, "init_process_group"), (torch.distributed, "destroy_process_group")):
        monkeypatch.setattr(module, name, getattr(module, name))  # restored after the test: the start wraps them
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    group.nbddp_start()
    assert capsys.readouterr().out.startswith("nbddp: no GPU visible: one process on the CPU")
    assert "ACCELERATE_USE_CPU" not in os.environ
    monkeypatch.setenv("NBDDP_NPROC", "1")  # one process asked for: nothing to say
    group.nbddp_start()
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(group, "NBDDP_WORLD_SIZE", 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    started = []
    monkeypatch.setattr(group, "nbddp_dist", lambda: started.append("group"))
    group.nbddp_start(group=False)  # the notebook imports Unsloth: the group starts after that import
    assert os.environ["ACCELERATE_USE_CPU"] == "true"  # else the Trainer ignores torchrun on a CPU machine
    assert capsys.readouterr().out == "nbddp: 2 processes, this one is rank 0 on cpu\n" and started == []
    group.nbddp_start()  # else before the notebook's first line
    assert started == ["group"]


def test_group_ranks_come_from_torchruns_environment():
    env = {**os.environ, "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}
    code = ("from nbddp.runtime import group as g; "
            "print(g.NBDDP_RANK, g.NBDDP_LOCAL_RANK, g.NBDDP_WORLD_SIZE, g.NBDDP_IS_MAIN, g.NBDDP_IS_LOCAL_MAIN)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == ["3", "1", "4", "False", "False"]


def test_files_run_on_the_machines_first_rank_only(monkeypatch, tmp_path, capfd):
    monkeypatch.chdir(tmp_path)
    files.nbddp_write_file("a.txt", "one\n")
    files.nbddp_write_file("a.txt", "two\n", append=True)
    assert (tmp_path / "a.txt").read_text() == "one\ntwo\n"
    files.nbddp_shell("echo from-shell; exit 3")
    out, err = capfd.readouterr()
    assert "from-shell" in out and "shell command exited with status 3" in err
    assert files.nbddp_getoutput("echo a; echo b") == ["a", "b"]
    with files.nbddp_main_process_first():
        (tmp_path / "cache").write_text("filled")
    monkeypatch.setattr(files, "NBDDP_IS_LOCAL_MAIN", False)  # another rank of the machine: writes nothing
    files.nbddp_write_file("b.txt", "x")
    files.nbddp_shell("touch c.txt")
    assert not (tmp_path / "b.txt").exists() and not (tmp_path / "c.txt").exists()


def test_own_copies_keep_the_notebooks_files_to_one_writer(monkeypatch, tmp_path):
    """On rank 1: a file of the notebook's is written and read back as the rank's own copy; caches, the temporary
    folder and paths that name the rank are written as they are."""
    work, cache = tmp_path / "work", tmp_path / "cache"
    (work / "run1").mkdir(parents=True)
    (work / "log.txt").write_text("rank 0's line\n")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HF_HOME", str(cache))
    own = files.NbddpOwnCopies(open, ranks=(1, 1))
    with own("run1/head.json", "w") as fh:
        fh.write("rank 1's")
    with own(work / "log.txt", "a") as fh:
        fh.write("rank 1's line\n")
    with own("rank1.json", "w") as fh:
        fh.write("own")
    (cache / "hub").mkdir(parents=True)
    with own(cache / "hub" / "x", "wb") as fh:
        fh.write(b"cache")
    assert own("run1/head.json").read() == "rank 1's" and not (work / "run1" / "head.json").exists()
    assert own("log.txt").read() == "rank 0's line\nrank 1's line\n"
    assert (work / "log.txt").read_text() == "rank 0's line\n"
    assert (work / "rank1.json").read_text() == "own" and (cache / "hub" / "x").read_bytes() == b"cache"
    assert own("rank1.json").read() == "own"  # read as it is
    (work / "compiled_cache").mkdir()
    with own("compiled_cache/mod.py", "w") as fh:
        fh.write("x = 1\n")
    assert (work / "compiled_cache" / "mod.py").read_text() == "x = 1\n"  # code the import system reads: as it is
    assert files.NbddpOwnCopies(open, ranks=(0, 0)).is_notebooks(str(work / "rank0.json"))  # rank 0 names nothing


def test_own_copies_hold_sqlite_databases_too(monkeypatch, tmp_path):
    """On rank 1, a database file of the notebook's is connected to as the rank's own copy, through the module's
    connect and dbapi2's; memory databases and paths that name the rank are as they are."""
    import sqlite3
    monkeypatch.chdir(tmp_path)
    with contextlib.closing(sqlite3.connect("metrics.db")) as db:
        db.execute("CREATE TABLE m (step INT)")
        db.execute("INSERT INTO m VALUES (0)")
        db.commit()
    module = types.SimpleNamespace(connect=sqlite3.connect, dbapi2=types.SimpleNamespace(connect=sqlite3.connect))
    files._nbddp_own_databases(module)
    monkeypatch.setattr("builtins.open", files.NbddpOwnCopies(open, ranks=(1, 1)))
    for connect in (module.connect, module.dbapi2.connect):
        with contextlib.closing(connect(tmp_path / "metrics.db")) as db:
            db.execute("INSERT INTO m VALUES (1)")
            db.commit()
    with contextlib.closing(module.connect("metrics.db")) as db:
        assert db.execute("SELECT COUNT(*) FROM m").fetchone()[0] == 3  # its own rows, read back
    with contextlib.closing(module.connect("rank1.db")) as db, contextlib.closing(module.connect(":memory:")) as mem:
        db.execute("CREATE TABLE r (x INT)")
        mem.execute("CREATE TABLE r (x INT)")
    monkeypatch.undo()
    with contextlib.closing(sqlite3.connect(tmp_path / "metrics.db")) as db:
        assert db.execute("SELECT COUNT(*) FROM m").fetchone()[0] == 1  # the notebook's file: rank 0's alone
    assert (tmp_path / "rank1.db").is_file()


@pytest.mark.parametrize("value, expected", [("1", True), ("on", True), ("0", False), ("off", False),
                                             ("auto", None), ("", None), (None, None)])
def test_hooks_switch_values(monkeypatch, value, expected):
    if value is not None:
        monkeypatch.setenv("NBDDP_PROBE", value)
    assert hooks._nbddp_choice("NBDDP_PROBE") is expected
    assert hooks._nbddp_flag("NBDDP_PROBE") is (expected is True)


def test_hooks_say_once_on_rank_0(monkeypatch, capsys):
    hooks.nbddp_say("k", "first")
    hooks.nbddp_say("k", "again")
    monkeypatch.setattr(hooks, "NBDDP_IS_MAIN", False)
    hooks.nbddp_say("other", "not rank 0")
    assert capsys.readouterr().out == "nbddp: first\n"


def test_hooks_patch_on_first_import_and_survive_a_failing_patch(tmp_path, monkeypatch, capsys):
    (tmp_path / "nbddp_probe_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def broken(module):
        raise ValueError("boom")

    hooks.NBDDP_IMPORTS.watch("nbddp_probe_mod", lambda m: setattr(m, "VALUE", 2))
    hooks.NBDDP_IMPORTS.watch("nbddp_probe_mod", broken)
    try:
        import nbddp_probe_mod
        assert nbddp_probe_mod.VALUE == 2
        assert "broken skipped (ValueError: boom)" in capsys.readouterr().out
        hooks.NBDDP_IMPORTS.watch("nbddp_probe_mod", lambda m: setattr(m, "VALUE", 3))  # imported: runs at once
        assert nbddp_probe_mod.VALUE == 3
    finally:
        sys.modules.pop("nbddp_probe_mod", None)


@pytest.mark.parametrize("mode, all_used, expected", [
    ("reentrant", True, (False, False, False)),  # find_unused=False is the cure; no static graph (docs/runtime.md)
    ("unsloth", True, (False, False, False)),
    ("non-reentrant", True, (False, False, False)),
    ("none", True, (False, False, False)),
    ("none", False, (False, True, False)),
    ("reentrant", False, (False, True, True)),
])
def test_strategy(mode, all_used, expected):
    assert strategy.nbddp_ddp_strategy(mode, all_used)[:3] == expected


def test_overrides_and_unsloth_aliases(monkeypatch):
    monkeypatch.setenv("UNSLOTH_DISABLE_DDP_STATIC_GRAPH_FOR_GRAD_CHECKPOINT", "1")
    static, find_unused, _, why = strategy.nbddp_ddp_strategy("reentrant")
    assert (static, find_unused) == (False, False) and "UNSLOTH_DISABLE_DDP_STATIC_GRAPH_FOR_GRAD_CHECKPOINT" in why
    assert strategy.nbddp_ddp_strategy("none")[0] is False
    monkeypatch.setenv("NBDDP_STATIC_GRAPH", "1")  # NBDDP_* wins over the aliases
    assert strategy.nbddp_ddp_strategy("reentrant")[0] is True
    monkeypatch.setenv("NBDDP_FIND_UNUSED", "1")
    assert strategy.nbddp_ddp_strategy("none")[1] is True
    monkeypatch.delenv("NBDDP_STATIC_GRAPH")
    monkeypatch.setenv("UNSLOTH_DISABLE_DDP_STATIC_GRAPH", "1")
    assert strategy.nbddp_ddp_strategy("reentrant")[0] is False


def _fake_zoo_checkpoint(monkeypatch, request):
    """The offloaded checkpoint of the fake unsloth_zoo (runtime_cases/fake_zoo), which leaves with the test: a later
    test in the same process must not find it."""
    monkeypatch.syspath_prepend(os.path.join(CASES, "fake_zoo"))
    request.addfinalizer(lambda: [sys.modules.pop(name) for name in list(sys.modules)
                                  if name.split(".")[0] == "unsloth_zoo"])
    from unsloth_zoo.gradient_checkpointing import unsloth_offloaded_checkpoint
    return unsloth_offloaded_checkpoint


def test_checkpointing_mode_detection(monkeypatch, request):
    import functools

    from torch.utils.checkpoint import checkpoint as torch_checkpoint

    block = torch.nn.Linear(2, 2)
    model = torch.nn.Sequential(block)
    assert strategy.nbddp_checkpointing_mode(model) == "none"
    monkeypatch.setenv("UNSLOTH_USE_GRADIENT_CHECKPOINTING", "1")
    assert strategy.nbddp_checkpointing_mode(model) == "unsloth"
    block.gradient_checkpointing = True
    block._gradient_checkpointing_func = functools.partial(torch_checkpoint, use_reentrant=False)
    assert strategy.nbddp_checkpointing_mode(model) == "non-reentrant"
    block._gradient_checkpointing_func = functools.partial(torch_checkpoint, use_reentrant=True)
    assert strategy.nbddp_checkpointing_mode(model) == "reentrant"
    block._gradient_checkpointing_func = _fake_zoo_checkpoint(monkeypatch, request)
    assert strategy.nbddp_checkpointing_mode(model) == "unsloth"
    checkpoint.nbddp_use_non_reentrant(model, offload=True)
    assert strategy.nbddp_checkpointing_mode(model) == "non-reentrant"
    loop = torch.nn.Module()
    loop.module = model
    assert checkpoint.nbddp_find_module(loop, lambda m: m is block) is None  # blocks are not wrappers' children
    assert checkpoint.nbddp_find_module(loop, lambda m: m is model) is model
    model.module = loop  # a wrapping cycle: the search ends
    assert checkpoint.nbddp_find_module(loop, lambda m: False) is None


def test_offload_checkpoint_gradients():
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(3, 4, requires_grad=True)
    checkpoint.nbddp_offload_checkpoint(lambda t: lin(t).tanh(), x).sum().backward()
    got = [x.grad.clone(), lin.weight.grad.clone()]
    x.grad = lin.weight.grad = None
    lin(x).tanh().sum().backward()
    torch.testing.assert_close(got, [x.grad, lin.weight.grad])


def test_tiled_mlp_gradients_and_hooks_fire_once():
    mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    x = torch.randn(2, 6, 4, requires_grad=True)
    fired = []
    for p in mlp.parameters():
        p.register_post_accumulate_grad_hook(lambda p: fired.append(p))
    tiled_mlp.nbddp_tiled_mlp(mlp, x, 3).pow(2).sum().backward()
    assert len(fired) == 4  # one per parameter, not one per chunk
    got = [x.grad.clone()] + [p.grad.clone() for p in mlp.parameters()]
    x.grad = None
    for p in mlp.parameters():
        p.grad = None
    mlp(x).pow(2).sum().backward()
    torch.testing.assert_close(got, [x.grad] + [p.grad for p in mlp.parameters()])


def test_tiled_mlp_patch_skips_unknown_api(capsys):
    fake = types.ModuleType("fake_tiled")

    class TiledMLP(torch.autograd.Function):
        @staticmethod
        def forward(ctx, fn, x):
            return x

    fake.TiledMLP = TiledMLP
    original = TiledMLP.apply
    tiled_mlp._nbddp_patch_tiled_mlp(fake)
    assert fake.TiledMLP.apply == original
    assert "API nbddp does not know" in capsys.readouterr().out


def test_peft_shim_is_a_no_op_where_peft_has_the_field():
    import peft

    before = peft.LoraConfig.__init__
    peft_shim._nbddp_patch_peft(peft)
    assert peft.LoraConfig.__init__ is before
    assert peft.LoraConfig(r=4, ensure_weight_tying=True).ensure_weight_tying is True


def test_peft_shim_drops_the_keyword_where_peft_lacks_it():
    @dataclasses.dataclass
    class LoraConfig:
        r: int = 8

    fake = types.SimpleNamespace(LoraConfig=LoraConfig)
    with pytest.raises(TypeError):
        LoraConfig(r=4, ensure_weight_tying=True)
    peft_shim._nbddp_patch_peft(fake)
    assert LoraConfig(r=4, ensure_weight_tying=True).r == 4


def test_xformers_bias_follows_query_device():
    seen = []
    fake = types.SimpleNamespace(memory_efficient_attention=lambda q, k, v, attn_bias=None: seen.append(attn_bias))
    xformers_shim._nbddp_patch_xformers(fake)
    q = torch.zeros(1, device="meta")
    fake.memory_efficient_attention(q, q, q, torch.zeros(1))
    assert seen[0].device.type == "meta"
    fake.memory_efficient_attention(q, q, q, None)
    assert seen[1] is None


def test_the_notebooks_batch_is_kept_where_the_process_count_divides_the_accumulation(monkeypatch, capsys):
    assert global_batch.nbddp_accumulation(4, batch=2) == 4  # one process
    world(monkeypatch, 2, global_batch)
    assert global_batch.nbddp_accumulation(4, batch=2) == 2
    assert "nbddp: 2 processes keep the notebook's batch of 8: gradient_accumulation_steps 4 -> 2 per rank" in \
        capsys.readouterr().out
    assert global_batch.nbddp_accumulation(global_batch.nbddp_accumulation(4)) == 2  # never divided twice
    hooks._NBDDP_SAID.clear()
    assert global_batch.nbddp_keep_batch(1, batch=2) == (1, 1)  # the accumulation does not divide: the batch does
    assert "2 processes keep the notebook's batch of 2: per_device_train_batch_size 2 -> 1 per rank " \
           "(gradient_accumulation_steps 1 does not divide by 2)" in capsys.readouterr().out
    hooks._NBDDP_SAID.clear()  # a batch the notebook set from the world size itself: both kept
    batch = global_batch.nbddp_batch_as_written(4, "per_device_train_batch_size")
    assert global_batch.nbddp_keep_batch(4, batch=batch) == (4, 4)
    assert "per_device_train_batch_size 4 kept as it computes it" in capsys.readouterr().out
    hooks._NBDDP_SAID.clear()
    assert global_batch.nbddp_keep_batch(1, batch=3) == (1, 3)  # neither divides
    said = capsys.readouterr().out
    assert "2 processes train 3 x 1 x 2 = 6 samples a step, 2 times the notebook's of 3" in said
    assert "make it or per_device_train_batch_size a multiple of 2" in said  # what to change
    hooks._NBDDP_SAID.clear()
    monkeypatch.setenv("NBDDP_BATCH", "scale")
    assert global_batch.nbddp_accumulation(4, batch=2) == 4
    assert "2 processes train 2 x 4 x 2 = 16 samples a step (NBDDP_BATCH=scale; the notebook of 8)" in \
        capsys.readouterr().out
    monkeypatch.setenv("NBDDP_BATCH", "half")
    with pytest.raises(SystemExit):
        global_batch.nbddp_accumulation(4)
    assert "NBDDP_BATCH='half': use keep" in capsys.readouterr().err


def test_every_training_args_keeps_the_notebooks_batch(monkeypatch):
    @dataclasses.dataclass
    class TrainingArguments:
        gradient_accumulation_steps: int = 4
        per_device_train_batch_size: int = 2

        def __post_init__(self):
            pass

    class SFTConfig(TrainingArguments):  # TRL's and Unsloth's configs call the base __post_init__
        def __post_init__(self):
            super().__post_init__()

    world(monkeypatch, 2, global_batch)
    global_batch._nbddp_patch_training_args(types.SimpleNamespace(TrainingArguments=TrainingArguments))
    assert TrainingArguments().gradient_accumulation_steps == 2
    assert SFTConfig(gradient_accumulation_steps=8).gradient_accumulation_steps == 4
    monkeypatch.setenv("NBDDP_BATCH", "scale")
    assert TrainingArguments().gradient_accumulation_steps == 4


def test_the_end_line_says_what_was_saved_and_where_the_other_ranks_output_went(monkeypatch, tmp_path):
    saved = {"lora_model": ["save_pretrained", "save_pretrained"], "outputs/checkpoint-3": ["save_pretrained"]}
    assert one_writer.nbddp_end_line(saved, 12.34) == \
        "done (status 0) in 12.3 s; saved by rank 0, once: lora_model (save_pretrained), outputs/checkpoint-3 " \
        "(save_pretrained)"
    world(monkeypatch, 2, one_writer)
    attempt = tmp_path / "run" / "attempt_0"
    for rank in ("0", "1"):
        (attempt / rank).mkdir(parents=True)
    error_file = str(attempt / "0" / "error.json")
    assert one_writer.nbddp_end_line({}, 1, error_file=error_file) == \
        "done (status 0) in 1.0 s; the other ranks' warnings and errors: on this console"
    (attempt / "1" / "stderr.log").write_text("")  # torchrun's --redirects: each other rank's output in files
    assert one_writer.nbddp_end_line({}, 1, error_file=error_file).endswith(
        f"; each other rank's output: {attempt}/<local rank>/stderr.log (and stdout.log; on each machine)")


def test_a_built_trainer_holds_the_decided_accumulation_as_a_plain_int(monkeypatch):
    """torch 2.11's compile could not trace an int subclass: Unsloth's compiled GRPO loss failed on
    NbddpAccumulation (2 H200s, 2026-11-27)."""
    world(monkeypatch, 2, global_batch)
    steps = global_batch.nbddp_accumulation(4, batch=2)
    assert isinstance(steps, global_batch.NbddpAccumulation)
    args = types.SimpleNamespace(gradient_accumulation_steps=steps, steps_per_generation=steps, seed=3)
    accelerator = types.SimpleNamespace(gradient_state=types.SimpleNamespace(plugin_kwargs={"num_steps": steps}))

    class Trainer:
        def __init__(self, args):
            self.args, self.accelerator = args, accelerator

    global_batch._nbddp_patch_trainer(types.SimpleNamespace(Trainer=Trainer))
    Trainer(args)
    assert type(args.gradient_accumulation_steps) is int and type(args.steps_per_generation) is int
    assert args.gradient_accumulation_steps == 2 and type(accelerator.gradient_state.plugin_kwargs["num_steps"]) is int


def _trainer_class(calls):
    class Trainer:  # a transformers 4 Trainer: no _build_accelerator_args
        args = types.SimpleNamespace(ddp_find_unused_parameters=None)

        def training_step(self, model, inputs):
            calls.append("step")
            return 1.0

    return Trainer


def test_trainer_patch_sets_static_graph_at_first_step_without_accelerator_hook(monkeypatch):
    calls = []
    Trainer = _trainer_class(calls)
    world(monkeypatch, 2, strategy)
    monkeypatch.setattr(strategy, "nbddp_decide", lambda model, args: (True, False))
    monkeypatch.setattr(strategy, "nbddp_apply_to_ddp", lambda model, static: calls.append(("apply", static)) or True)
    strategy._nbddp_patch_trainer_ddp(types.SimpleNamespace(Trainer=Trainer))
    trainer = Trainer()
    trainer.training_step(object(), {})
    trainer.training_step(object(), {})
    assert calls == [("apply", True), "step", "step"]


def test_trainer_patch_sets_accelerates_ddp_kwargs(monkeypatch):
    calls = []
    Trainer = _trainer_class(calls)
    handler = types.SimpleNamespace(static_graph=None, find_unused_parameters=True)
    Trainer._build_accelerator_args = lambda self: {"kwargs_handlers": [handler, object()]}
    world(monkeypatch, 2, strategy)
    monkeypatch.setattr(strategy, "nbddp_decide", lambda model, args: (False, False))
    monkeypatch.setattr(strategy, "nbddp_apply_to_ddp", lambda model, static: calls.append("apply") or True)
    strategy._nbddp_patch_trainer_ddp(types.SimpleNamespace(Trainer=Trainer))
    trainer = Trainer()
    trainer.model, trainer.args = object(), types.SimpleNamespace()
    trainer._build_accelerator_args()
    trainer.training_step(object(), {})
    assert (handler.static_graph, handler.find_unused_parameters) == (False, False)
    assert (trainer.args.ddp_static_graph, trainer.args.ddp_find_unused_parameters) == (False, False)
    assert calls == ["step"]  # decided once, where the DDP kwargs are built


def test_trainer_patch_never_stops_training(monkeypatch, capsys):
    calls = []
    Trainer = _trainer_class(calls)
    world(monkeypatch, 2, strategy)

    def broken(model, args):
        raise KeyError("x")

    monkeypatch.setattr(strategy, "nbddp_decide", broken)
    strategy._nbddp_patch_trainer_ddp(types.SimpleNamespace(Trainer=Trainer))
    Trainer().training_step(object(), {})
    assert calls == ["step"] and "DDP strategy left to transformers (KeyError" in capsys.readouterr().out


def test_decide_swaps_checkpointing_only_where_parameters_may_be_unused(capsys):
    from torch.utils.checkpoint import checkpoint as torch_checkpoint
    import functools

    block = torch.nn.Linear(2, 2)
    block.gradient_checkpointing, block._gradient_checkpointing_func = True, functools.partial(torch_checkpoint,
                                                                                              use_reentrant=True)
    model = torch.nn.Sequential(block)
    assert strategy.nbddp_decide(model, types.SimpleNamespace(ddp_find_unused_parameters=False)) == (False, False)
    assert strategy.nbddp_checkpointing_mode(model) == "reentrant"
    hooks._NBDDP_SAID.clear()
    assert strategy.nbddp_decide(model, types.SimpleNamespace(ddp_find_unused_parameters=True)) == (False, True)
    assert strategy.nbddp_checkpointing_mode(model) == "non-reentrant"  # not offloaded: the original was not
    assert "switched to non-reentrant checkpointing" in capsys.readouterr().out


def test_apply_to_ddp_finds_the_ddp_module_inside_wrappers():
    class DistributedDataParallel(torch.nn.Module):
        static_graph = False

        def _set_static_graph(self):
            self.static_graph = True

    ddp, outer = DistributedDataParallel(), torch.nn.Module()
    outer.module = ddp
    assert strategy.nbddp_apply_to_ddp(outer, static=True) and ddp.static_graph
    assert strategy.nbddp_apply_to_ddp(torch.nn.Linear(1, 1), static=True) is False


def test_lean_sync_steps_aside_where_ddp_has_no_init_sync(monkeypatch, capsys):
    class DistributedDataParallel:
        def __init__(self, module, process_group=None):
            self.module = module

    fake = types.SimpleNamespace(DistributedDataParallel=DistributedDataParallel)
    world(monkeypatch, 2, lean_sync)
    lean_sync._nbddp_patch_ddp(fake)
    assert "_nbddp_patched" not in vars(DistributedDataParallel)
    assert "start-up sync left to DDP" in capsys.readouterr().out


def test_lean_sync_wraps_torchs_ddp_and_leaves_explicit_choices_alone(monkeypatch):
    seen = []

    class DistributedDataParallel:
        def __init__(self, module, *args, init_sync=True, **kwargs):
            seen.append(init_sync)
            self.module = module

    monkeypatch.setattr(lean_sync, "nbddp_sync_module_states", lambda ddp, buffers: seen.append(("synced", buffers)) or 0)
    lean_sync._nbddp_patch_ddp(types.SimpleNamespace(DistributedDataParallel=DistributedDataParallel))
    DistributedDataParallel(torch.nn.Linear(2, 2))
    DistributedDataParallel(torch.nn.Linear(2, 2), init_sync=True)  # the caller's own choice
    DistributedDataParallel(torch.nn.Linear(2, 2), broadcast_buffers=False)
    assert seen == [False, ("synced", True), True, False, ("synced", False)]


def test_balance_window_keeps_each_step_and_evens_the_ranks():
    lengths = [5, 90, 7, 80, 6, 85, 9, 70]  # drawn: rank 0 gets the four long samples, rank 1 the short ones
    drawn = [[0, 1], [2, 3], [4, 5], [6, 7]]  # batch i -> rank i % 2; two micro-batches per rank
    dealt = balance.nbddp_balance_window(drawn, lengths.__getitem__, 2)
    assert sorted(i for b in dealt for i in b) == list(range(8))
    assert all(len(b) == 2 for b in dealt)

    def padded(batches, rank):
        return sum(len(b) * max(lengths[i] for i in b) for b in batches[rank::2])

    assert [padded(drawn, r) for r in (0, 1)] == [2 * 90 + 2 * 85, 2 * 80 + 2 * 70]
    assert max(padded(dealt, r) for r in (0, 1)) < max(padded(drawn, r) for r in (0, 1))
    assert balance.nbddp_balance_window(dealt, lengths.__getitem__, 2) == dealt  # dealing twice changes nothing
    ragged = [[0, 1], [2]]  # the epoch's last, short batch: left as drawn
    assert balance.nbddp_balance_window(ragged, lengths.__getitem__, 2) == ragged


def test_balanced_batches_window_and_delegation():
    class Inner:
        batch_size, drop_last, sampler = 2, False, "the sampler"

        def __iter__(self):
            return iter([[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]])

        def __len__(self):
            return 5

    lengths = [5, 90, 7, 80, 6, 85, 9, 70, 1, 2]
    wrapped = balance.NbddpBalancedBatches(Inner(), lengths.__getitem__, world=2, accumulation=2)
    assert (wrapped.batch_size, wrapped.drop_last, wrapped.sampler, len(wrapped)) == (2, False, "the sampler", 5)
    out = list(wrapped)
    assert sorted(i for b in out[:4] for i in b) == list(range(8)) and out[4] == [8, 9]
    assert out[:4] != [[0, 1], [2, 3], [4, 5], [6, 7]]  # the full window was re-dealt, the partial one not


def _loader_and_trainer(monkeypatch, **args):
    class BatchSamplerShard:
        split_batches, num_processes, batch_sampler = False, 2, [[0, 1]]

    class Data:
        column_names = ["input_ids"]

        def select_columns(self, names):
            return [{"input_ids": [1] * n} for n in (3, 1)]

    loader = types.SimpleNamespace(batch_sampler=BatchSamplerShard(), dataset=Data())
    trainer = types.SimpleNamespace(args=types.SimpleNamespace(**{
        "gradient_accumulation_steps": 2, "average_tokens_across_devices": True, "train_sampling_strategy": "random",
        "length_column_name": "length", **args}), model_accepts_loss_kwargs=True, processing_class=None)
    world(monkeypatch, 2, balance)
    return loader, trainer


@pytest.mark.parametrize("args, env, balanced, says", [
    ({}, None, True, "length-balanced ranks: each optimizer step's 2 x 2 micro-batches"),  # on by default
    ({}, "1", True, "length-balanced ranks: each optimizer step's 2 x 2 micro-batches"),
    ({"average_tokens_across_devices": False}, None, False, "would change the gradient"),
    ({"average_tokens_across_devices": False}, "force", True, "length-balanced ranks: each"),
    ({}, "0", False, None),  # off: nothing said
    ({"train_sampling_strategy": "group_by_length"}, "1", False, "length-aware sampling order of its own"),
])
def test_balance_loader_only_where_the_gradient_cannot_change(monkeypatch, capsys, args, env, balanced, says):
    if env is not None:
        monkeypatch.setenv("NBDDP_BALANCE_LENGTHS", env)
    loader, trainer = _loader_and_trainer(monkeypatch, **args)
    balance.nbddp_balance_loader(loader, trainer)
    wrapped = loader.batch_sampler.batch_sampler
    assert isinstance(wrapped, balance.NbddpBalancedBatches) is balanced
    out = capsys.readouterr().out
    assert (says in out) if says else "length-balanced" not in out
    if balanced:
        assert [wrapped.length(i) for i in (0, 1)] == [3, 1]
        balance.nbddp_balance_loader(loader, trainer)  # a second call wraps nothing twice
        assert loader.batch_sampler.batch_sampler is wrapped


def test_balance_patch_wraps_the_trainers_loader_once(monkeypatch):
    class Trainer:
        def get_train_dataloader(self):
            return "loader"

    monkeypatch.setattr(balance, "nbddp_balance_loader", lambda loader, trainer: f"balanced {loader}")
    module = types.SimpleNamespace(Trainer=Trainer)
    balance._nbddp_patch_trainer_loader(module)
    balance._nbddp_patch_trainer_loader(module)
    assert Trainer().get_train_dataloader() == "balanced loader"


# ---- what a script guarantees (the 2-rank runs are in test_runtime_guarantees.py) ----
def test_one_writer_runs_a_save_on_rank_0_only(monkeypatch):
    calls = []
    monkeypatch.setattr(one_writer, "NBDDP_ONE_WRITER", True)

    def save(path):
        calls.append(path)
        inner("nested")  # a save inside a save runs as it is
        return "saved"

    inner = one_writer.nbddp_one_writer(lambda path: calls.append(path), "save_pretrained")
    wrapped = one_writer.nbddp_one_writer(save, "save_pretrained")
    assert one_writer.nbddp_one_writer(wrapped, "save_pretrained") is wrapped  # never twice
    assert wrapped("a") == "saved" and calls == ["a", "nested"]
    monkeypatch.setattr(one_writer, "NBDDP_IS_MAIN", False)
    assert wrapped("b") is None and calls == ["a", "nested"]


def test_one_writer_wraps_what_unsloth_attaches_and_wandb_on_other_ranks(monkeypatch):
    monkeypatch.setattr(one_writer, "NBDDP_ONE_WRITER", True)
    monkeypatch.setattr(one_writer, "NBDDP_IS_MAIN", False)
    written = []
    model = types.SimpleNamespace(save_pretrained_gguf=lambda *a: written.append(a), push_to_hub_merged=print,
                                  generate=lambda: "kept", original_push_to_hub=print)
    save = types.SimpleNamespace(patch_saving_functions=lambda m, vision=False: m)
    one_writer._nbddp_patch_unsloth_save(save)
    assert save.patch_saving_functions(model) is model
    model.save_pretrained_gguf("dir")
    assert written == [] and model.generate() == "kept" and model.original_push_to_hub is print
    assert model.push_to_hub_merged.__wrapped__ is print
    wandb = types.SimpleNamespace(init=lambda **kwargs: kwargs)
    one_writer._nbddp_patch_wandb(wandb)
    assert wandb.init(project="p") == {"project": "p", "mode": "disabled"}


ATTACHED_PICKLES = """
import json, pickle, textwrap, types
import dill
plain = nbddp_one_writer_attached(types.SimpleNamespace(save_pretrained_merged=json.dump))
assert plain.save_pretrained_merged.__wrapped__ is json.dump
assert nbddp_one_writer_attached(plain).save_pretrained_merged is plain.save_pretrained_merged  # once
print(pickle.loads(pickle.dumps(plain)).save_pretrained_merged is json.dump)
tokenizer = types.SimpleNamespace(save_pretrained_merged=json.dump)
tokenizer.save_pretrained = types.MethodType(textwrap.indent, tokenizer)  # bound to it, as Unsloth does
copy = dill.loads(dill.dumps(nbddp_one_writer_attached(tokenizer)))  # datasets' map workers use dill
print(copy.save_pretrained_merged is json.dump, copy.save_pretrained.__func__ is textwrap.indent,
      copy.save_pretrained.__self__ is copy)
# transformers copies PushToHubMixin.push_to_hub (patched) into its classes by the code; Unsloth keeps the copy bound
# as `original_push_to_hub`; dill pickles the copy by value (recurse: every function it reaches, too), and must not
# reach transformers' own push_to_hub by value: no longer at its class, it would travel with its module's globals
import functools, inspect
import transformers.tokenization_utils_base as base
from multiprocess.reduction import ForkingPickler  # what datasets' map(num_proc=2) sends its function with
tokenizer.original_push_to_hub = types.MethodType(base.PreTrainedTokenizerBase.push_to_hub, tokenizer)
payload = bytes(ForkingPickler.dumps(tokenizer))  # dill's defaults: a copy by value, with its globals
print(b"nbddp_store" not in payload, callable(dill.loads(payload).original_push_to_hub))
dill.settings["recurse"] = True
carries = lambda payload, function: inspect.unwrap(function).__code__.co_code in payload  # its code travels too
tokenizer.original_push_to_hub = types.MethodType(base.PreTrainedTokenizerBase.push_to_hub, tokenizer)
payload = dill.dumps(tokenizer)
print(getattr(base.PreTrainedTokenizerBase.push_to_hub, "_nbddp_one_writer", False),
      not carries(payload, base.PreTrainedTokenizerBase.push_to_hub) and b"_nbddp_skipped" not in payload,
      callable(dill.loads(payload).original_push_to_hub))
# a later patch (Unsloth patches everything) displaces the class's writer, which then pickles by value, small
ours = base.PreTrainedTokenizerBase.save_pretrained
base.PreTrainedTokenizerBase.save_pretrained = functools.wraps(ours)(lambda *args, **kwargs: ours(*args, **kwargs))
tokenizer.original_save_pretrained = types.MethodType(ours, tokenizer)
payload = dill.dumps(tokenizer.original_save_pretrained)
print("save_directory" in inspect.signature(ours).parameters, not carries(payload, ours),
      b"_nbddp_skipped" not in payload)
"""


def test_an_attached_writer_pickles_as_the_method_it_wraps_in_a_script(tmp_path):
    """Unsloth attaches saving methods to the tokenizer, and datasets' map workers get the tokenizer by pickle (the
    Trainer's own tokenizing with num_proc): in a script, where the runtime is the script's own code, a closure
    there would not pickle (pickle: a local object; dill: by value, with every script function it reaches, which on a
    GPU machine reached a torch config module that cannot be pickled: `cannot pickle 'ConfigModuleInstance'`)."""
    from nbddp import inline

    script = tmp_path / "script.py"
    script.write_text(inline.render(inline.Choice({"one_writer": "test"})) + ATTACHED_PICKLES, encoding="utf-8")
    env = dict(os.environ, WORLD_SIZE="2", RANK="0")  # a rank of a 2-process job: the one writer is on
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True"] * 12, done.stdout + done.stderr[-2000:]


def test_agreement_stats_and_which_ranks_differ():
    big = torch.arange(-3.0, 5.0)
    assert agree.nbddp_weight_stats([big, torch.ones(2, 3)]) == [[4.0, 16.0], [6.0, 6.0]]
    same = [[1.0, 2.0], [0.0, 5.0]]
    assert agree.nbddp_ranks_that_differ([same, [row[:] for row in same]]) == []
    assert agree.nbddp_ranks_that_differ([same, [[1.0 + 1e-9, 2.0], [0.0, 5.0]]]) == []  # rounding
    assert agree.nbddp_ranks_that_differ([same, same, [[1.0, 2.0], [1e-3, 5.0]], same[:1]]) == [2, 3]
    nan = [[float("nan"), float("nan")]]
    assert agree.nbddp_ranks_that_differ([nan, nan]) == []


def test_input_answer_from_a_terminal_a_pipe_or_no_one(monkeypatch):
    monkeypatch.setattr(ask, "NBDDP_INPUT_GRACE", 0.05)
    monkeypatch.setitem(ask._NBDDP_INPUT, "input", lambda prompt: sys.stdin.readline().rstrip("\n") or
                        (_ for _ in ()).throw(EOFError()))
    read, write = os.pipe()
    with os.fdopen(read) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        assert ask._nbddp_answer("?") == "-stdin is not a terminal and has nothing to read"  # nobody writes
        os.write(write, b"yes\n")
        assert ask._nbddp_answer("?") == "+yes"
        os.close(write)
        assert ask._nbddp_answer("?") == "-stdin is closed"
    monkeypatch.setattr(sys, "stdin", None)
    assert ask._nbddp_answer("?").startswith("-")
    with pytest.raises(EOFError, match="no one to answer it"):  # one process without a group: no store
        ask.nbddp_input("?")


def test_waits_without_a_group_and_the_waiting_line(monkeypatch, capsys):
    assert wait.nbddp_store_barrier("x") is False and wait.nbddp_store() is None
    group.nbddp_barrier("save_pretrained_gguf")  # one process: nothing to wait for
    monkeypatch.setattr(wait, "NBDDP_WAIT_NOTICE", 0.0)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: 1)
    polls = iter([False, False, True])
    wait.nbddp_wait_until(lambda: next(polls), lambda: "rank 0: save_pretrained_gguf")
    assert capsys.readouterr().err == "nbddp: rank 1 waiting for rank 0: save_pretrained_gguf\n"


def test_a_loop_nbddp_could_not_wrap_stops_every_rank_with_one_line(monkeypatch, capsys):
    loop.nbddp_unsynced_loop("the training loop of cell 3")  # one process: it trains as it is
    world(monkeypatch, 2, loop)
    with pytest.raises(SystemExit) as stopped:
        loop.nbddp_unsynced_loop("the training loop of cell 3")
    assert stopped.value.code == 1
    assert capsys.readouterr().out.startswith("nbddp: the training loop of cell 3 trains outside DDP")


def _group_env(world: int = 1) -> list[dict]:
    """Each rank's environment for a script that starts its own gloo group on a free port (PORT, RANK, WORLD_SIZE)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("NBDDP_")}
    return [{**env, "PORT": str(port), "RANK": str(r), "WORLD_SIZE": str(world)} for r in range(world)]


def _ranks(script: str, cwd, stdins=None, env=None) -> list[str]:
    """The output of each rank of a 2-process job of `script` (stdout and stderr), after each exits 0; `stdins`:
    each rank's stdin, closed here once the ranks have them; `env`: added to each rank's environment."""
    ranks = [subprocess.Popen([sys.executable, "-c", script], env={**own, **(env or {})},
                              stdin=stdins[r] if stdins else None, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=cwd)
             for r, own in enumerate(_group_env(2))]
    for fd in stdins or ():
        os.close(fd)
    out = [rank.communicate(timeout=120)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0], out
    return out


AGREE_FAILS = """
import os, torch, torch.distributed as dist
from nbddp.runtime import agree
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=0, world_size=1)
agree.NBDDP_CHECK_AGREEMENT = True
weight = torch.nn.Parameter(torch.ones(3))
print("same", agree.nbddp_check_agreement([weight], "train()"))
def broken(params):
    raise RuntimeError("meta tensors hold no data")
agree.nbddp_weight_stats = broken
print("broken", agree.nbddp_check_agreement([weight], "train()"))
dist.destroy_process_group()
"""


def test_an_agreement_check_that_cannot_read_the_weights_warns_and_the_training_stands(tmp_path):
    done = subprocess.run([sys.executable, "-c", AGREE_FAILS], env=_group_env()[0], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and "same []" in lines and "broken None" in lines, done.stdout + done.stderr[-2000:]
    assert ("nbddp: warning: after train(), the ranks' weights were not compared (rank 0: RuntimeError: meta "
            "tensors hold no data)") in lines


def test_a_loops_loader_keeps_the_notebooks_batch_or_scales_it(monkeypatch):
    data = torch.utils.data
    world(monkeypatch, 2, loop)
    monkeypatch.setattr(loop, "NBDDP_RANK", 1)
    plain = data.DataLoader(list(range(8)), batch_size=4)
    assert [b.tolist() for b in loop._nbddp_deal(plain)] == [[1, 3], [5, 7]]  # its slice of the notebook's batches

    def shuffled():
        return data.DataLoader(list(range(8)), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5))

    batches = [b.tolist() for b in shuffled()]  # what one process draws; every rank draws the same
    assert [b.tolist() for b in loop._nbddp_deal(shuffled())] == [b[1::2] for b in batches]
    odd = data.DataLoader(list(range(9)), batch_size=3)  # 3 does not divide by 2: each rank its own 3 a step
    assert [len(b) for b in loop._nbddp_deal(odd)] == [3, 2]
    monkeypatch.setenv("NBDDP_BATCH", "scale")
    assert [b.tolist() for b in loop._nbddp_deal(plain)] == [[1, 3, 5, 7]]


AGREE_DIFFERS = """
import os, torch, torch.distributed as dist
from nbddp.runtime import agree
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=rank, world_size=2)
agree.NBDDP_CHECK_AGREEMENT = True
a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2) * (1 + rank))
run_dir, steps, tags, local = f"runs/{os.getpid()}", 7, {"x", "y"}, int(os.environ["RANK"])  # the notebook's values
agree.nbddp_check_agreement([("layer.lora_A", a), ("layer.lora_B", b), ("tied", a)], "train()")
agree.nbddp_check_agreement([a, b], "the script's own training steps")
dist.destroy_process_group()
"""


def test_ranks_that_differ_are_told_with_the_values_that_differ(tmp_path):
    out = _ranks(AGREE_DIFFERS, tmp_path)
    said = [line for line in out[0].splitlines() if line.startswith("nbddp: warning: after")]
    assert len(said) == 2 and "other weights" not in out[1], out
    assert "(5 trained values in 2 tensors): on rank 1: layer.lora_B (sum 4 against 2) of 2 tensors; the " \
           "notebook's values that differ on rank 1: run_dir." in said[0]  # not steps, tags, nor the rank itself
    assert "on rank 1: tensor 1 of shape (2,) (sum 4 against 2) of 2 tensors; the notebook's" in said[1]
    assert "layer.lora_A" not in said[0]


def test_which_values_differ_between_ranks():
    same = [[1.0, 2.0], [0.0, 5.0]]
    other = [[1.5, 2.0], [1e-3, 5.0]]
    assert agree.nbddp_tensors_that_differ(other, same) == [0, 1]
    assert agree.nbddp_what_differs([same, other], ["a", "b"], 1, shown=1) == \
        "on rank 1: a (sum 1.5 against 1) and 1 more of 2 tensors"
    assert agree.nbddp_what_differs([same, same[:1]], ["a", "b"], 1) == "rank 1 trained 1 tensors, rank 0 2"


STDIN_READERS = """
import json, os, sys, time, torch.distributed as dist
rank = int(os.environ["RANK"])
from nbddp.runtime import ask, stdin_fd
stdin_fd.nbddp_share_stdin()  # as the script starts, before the group
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=rank, world_size=2)
start = time.monotonic()
try:
    line = input()  # Python's reader: rank 0 reads, every rank gets the line
except EOFError as exc:
    line = "EOFError: " + str(exc)
below = os.read(0, 64)  # a reader below Python's stdin (a prompt toolkit): what rank 0's stdin holds next
after = os.read(0, 64)  # and then the end of the input
print(json.dumps({"rank": rank, "line": line, "below": below.decode(), "after": after.decode(),
                  "seconds": time.monotonic() - start}), flush=True)
dist.barrier()  # rank 0 holds the store until every rank has read
dist.destroy_process_group()
"""


def _stdin_records(tmp_path, rank0, env=None):
    """What each rank's readers got, rank 0's stdin the pipe `rank0` (read, write), rank 1's a pipe of its own."""
    import json

    read, write = os.pipe()
    os.write(write, b"rank 1's own\n")
    os.close(write)
    out = _ranks(STDIN_READERS, tmp_path, [rank0[0], read], env)
    return [json.loads(line) for text in out for line in text.splitlines() if line.startswith("{")], out


def test_every_rank_reads_rank_0s_stdin_through_python_and_below_it_alike(tmp_path):
    read, write = os.pipe()
    os.write(write, b"first line\nsecond line\nthird\n")
    os.close(write)
    records, out = _stdin_records(tmp_path, (read, None))
    assert [(r["line"], r["below"], r["after"]) for r in records] == \
        [("first line", "second line\nthird\n", "")] * 2, out


def test_a_pipe_nobody_writes_ends_for_every_reader_in_bounded_time(tmp_path):
    read, write = os.pipe()  # stays open while the ranks run: nothing ever comes
    try:
        records, out = _stdin_records(tmp_path, (read, write), {"NBDDP_STDIN_QUIET": "1"})
    finally:
        os.close(write)
    said = "input() in a 2-process job has no one to answer it (stdin is not a terminal and has nothing to read)"
    assert [(r["line"].startswith("EOFError: nbddp: " + said), r["below"], r["after"]) for r in records] == \
        [(True, "", "")] * 2, out
    assert max(r["seconds"] for r in records) < 10, out


TOOLKIT_PROMPT = """
import json, os, sys, time, torch.distributed as dist
rank = int(os.environ["RANK"])
from nbddp.runtime import stdin_fd
stdin_fd.nbddp_share_stdin()
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=rank, world_size=2)
from prompt_toolkit import prompt as ask_user  # a prompt toolkit: it reads file descriptor 0 itself

def name_please():
    try:
        return ask_user("Name: ")
    except EOFError:
        return "EOFError"

start = time.monotonic()
print("TOOLKIT " + json.dumps({"rank": rank, "got": name_please(), "seconds": time.monotonic() - start}), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("written, got", [(b"alice\n", "alice"), (b"", "EOFError")])
def test_a_prompt_toolkit_reads_rank_0s_stdin_on_every_rank_and_a_silent_pipe_ends(tmp_path, written, got):
    pytest.importorskip("prompt_toolkit")
    import json

    read, write = os.pipe()  # rank 0's stdin: stays open while the ranks run, with `written` in it
    os.write(write, written)
    other, closed = os.pipe()  # rank 1's own stdin: text that must not be read
    os.write(closed, b"rank 1's own\n")
    os.close(closed)
    try:
        out = _ranks(TOOLKIT_PROMPT, tmp_path, [read, other], {"NBDDP_STDIN_QUIET": "1"})
    finally:
        os.close(write)
    records = [json.loads(line.split("TOOLKIT ", 1)[1]) for text in out for line in text.splitlines()
               if "TOOLKIT " in line]
    assert sorted((r["rank"], r["got"]) for r in records) == [(0, got), (1, got)], out
    assert max(r["seconds"] for r in records) < 10, out


EXIT_WHILE_WAITING = """
import atexit, os, sys, time
from nbddp.runtime import stdin_fd
ending = []

class Store:  # rank 0 never sends anything: the other rank's thread waits for its first piece
    def check(self, keys):
        if ending:  # Python's own end has begun: a thread still in the store's C++ code here aborts the process
            os.write(1, b"CHECKED WHILE ENDING\\n")
        return False

stdin_fd.nbddp_store = lambda: Store()
stdin_fd.NBDDP_IS_MAIN = False
stdin_fd.NBDDP_WORLD_SIZE = 2
stdin_fd.nbddp_share_stdin()
atexit.register(lambda: (ending.append(1), time.sleep(0.5)))
time.sleep(0.3)
print("MAIN DONE", flush=True)
"""


def test_the_stdin_thread_ends_with_the_script_before_pythons_own_end(tmp_path):
    script = tmp_path / "exit.py"
    script.write_text(EXIT_WHILE_WAITING)
    env = dict(os.environ, NBDDP_INPUT="1")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=30, env=env,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0 and "MAIN DONE" in done.stdout, done.stdout + done.stderr
    assert "CHECKED WHILE ENDING" not in done.stdout, done.stdout


def test_a_folder_made_with_exist_ok_costs_no_wait_and_one_made_without_still_fails(monkeypatch, tmp_path):
    import pathlib
    import time

    class Store:  # no rank of this job said it made the folder
        def check(self, keys):
            return False

    world(monkeypatch, 2, file_races)
    monkeypatch.setattr(file_races, "nbddp_store", lambda: Store())
    monkeypatch.setattr(os, "mkdir", os.mkdir)  # restored after the test: the net patches it
    there = tmp_path / "there"
    there.mkdir()
    file_races.nbddp_folders_once()
    start = time.monotonic()
    os.makedirs(there, exist_ok=True)
    pathlib.Path(there).mkdir(exist_ok=True)
    assert time.monotonic() - start < 0.5  # the callers take it as made: no wait for another rank's word
    with pytest.raises(FileExistsError):
        os.makedirs(there)  # made before the job, by no rank of it: the notebook's own error, after the wait
    assert time.monotonic() - start > 1.5


def test_a_file_moved_into_a_folder_by_another_rank_is_found_there(monkeypatch, tmp_path):
    """The rank that comes second to `shutil.move(src, folder)` finds src moved there by another rank of the job
    (shutil raises before any rename); a file that another rank did not move still raises."""
    import shutil

    class Store(dict):  # what the other rank recorded
        def check(self, keys):
            return all(key in self for key in keys)

        def get(self, key):
            return self[key].encode()

        def set(self, key, value):
            self[key] = value

    store = Store()
    world(monkeypatch, 2, file_races)
    monkeypatch.setattr(file_races, "nbddp_store", lambda: store)
    for name in ("rename", "replace"):
        monkeypatch.setattr(os, name, getattr(os, name))  # restored after the test: the net patches them
    monkeypatch.setattr(shutil, "move", shutil.move)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "raw.txt").write_text("rows")
    file_races.nbddp_moves_once()
    assert shutil.move("raw.txt", "data") == os.path.join("data", "raw.txt")  # the first rank
    assert store == {f"nbddp/moved/{tmp_path / 'raw.txt'}": str(tmp_path / "data" / "raw.txt")}
    assert shutil.move(tmp_path / "raw.txt", "data/") == os.path.join("data/", "raw.txt")  # the second: no error
    (tmp_path / "other.txt").write_text("x")
    (tmp_path / "data" / "other.txt").write_text("there before")
    with pytest.raises(shutil.Error):
        shutil.move("other.txt", "data")


def test_handlers_that_send_records_away_send_them_from_rank_0_only():
    """On a rank other than 0, logging's HTTP, socket (and datagram), mail and syslog handlers drop each record;
    in the body of the notebook's own test of the rank, they send it as written."""
    import logging
    import logging.handlers as lh

    sent = []
    kinds = {name: type(name, (getattr(lh, name),), {"emit": lambda self, record: sent.append(type(self).__name__)})
             for name in ("HTTPHandler", "SocketHandler", "SMTPHandler", "SysLogHandler")}
    one_writer._nbddp_patch_senders(types.SimpleNamespace(**kinds))
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "step", (), None)
    for kind in kinds.values():
        kind.emit(object.__new__(kind), record)
    assert sent == []
    with one_writer.nbddp_rank_block():
        for kind in kinds.values():
            kind.emit(object.__new__(kind), record)
    assert sent == list(kinds)


SAME_VALUES = """
import json, os, torch.distributed as dist
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=rank, world_size=2)
from nbddp.runtime import share
os.makedirs(f"machine{rank}", exist_ok=True)
os.chdir(f"machine{rank}")  # each rank a folder of its own, as on machines of their own
open(f"made-by-{rank}.txt", "w").close()
ns = {"run": f"runs/{os.getpid()}", "sizes": [rank, 2], "kept": object(), "path": f"made-by-{rank}.txt",
      "mine": rank, "main": rank == 0,  # the rank and a flag, as a library of the notebook's may give them
      "device": f"cuda:{rank}", "part": f"part-{rank}-of-2.json", "both": f"r{rank}-{os.getpid()}"}  # strings of it
share.nbddp_same_values(ns, "run", "sizes", "kept", "path", "absent", "mine", "main", "device", "part", "both")
import threading
given = {"lock": threading.Lock(), "rows": [1, 2]} if rank == 0 else {}  # what rank 0 alone ran
share.nbddp_share_values(given, "lock", "rows")
ns["given"] = sorted(given)
print(json.dumps({"rank": rank, "run": ns["run"], "sizes": ns["sizes"], "path": ns["path"], "pid": os.getpid(),
                  "kept": type(ns["kept"]).__name__, "mine": ns["mine"], "main": ns["main"], "given": ns["given"],
                  "device": ns["device"], "part": ns["part"], "both": ns["both"]}))
dist.destroy_process_group()
"""


def test_rank_0s_values_go_to_every_rank_where_they_can_and_should(tmp_path):
    texts = _ranks(SAME_VALUES, tmp_path)
    out = [json.loads(next(line for line in text.splitlines() if line.startswith("{"))) for text in texts]
    assert out[0]["run"] == out[1]["run"] == f"runs/{out[0]['pid']}", out
    assert out[0]["sizes"] == out[1]["sizes"] == [0, 2] and out[1]["kept"] == "object", out
    assert [o["path"] for o in out] == ["made-by-0.txt", "made-by-1.txt"], out  # rank 0's file is not there
    assert [(o["mine"], o["main"]) for o in out] == [(0, True), (1, False)], out  # each rank's own
    assert [(o["device"], o["part"]) for o in out] == [("cuda:0", "part-0-of-2.json"), ("cuda:1", "part-1-of-2.json")]
    assert out[0]["both"] == out[1]["both"] == f"r0-{out[0]['pid']}", out  # the rank, and more than the rank
    assert [o["given"] for o in out] == [["lock", "rows"], ["rows"]], out  # a lock cannot be sent: rank 0 says so
    assert "nbddp: rank 0's lock (a lock) cannot be sent to the other ranks: they have none" in texts[0], texts[0]


SHARE_UNREADABLE = """
import os, torch.distributed as dist
from nbddp.runtime import share
class Config:  # as a tracker's config: pickles, and reading it back recurses (no _items yet)
    def __init__(self):
        self._items = {"lr": 0.1}
    def __getattr__(self, key):
        return self._items[key]
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + os.environ["PORT"], rank=rank, world_size=2)
ns = {"cfg": Config(), "plain": [1, 2]} if rank == 0 else {}
share.nbddp_share_values(ns, "cfg", "plain")
print("rank", rank, "has", sorted(ns), ns["plain"])
dist.destroy_process_group()
"""


def test_a_value_that_cannot_be_read_back_is_not_sent_and_rank_0_says_so(tmp_path):
    first, second = _ranks(SHARE_UNREADABLE, tmp_path)
    assert "rank 0 has ['cfg', 'plain'] [1, 2]" in first and "rank 1 has ['plain'] [1, 2]" in second, (first, second)
    assert "rank 0's cfg (a Config) cannot be sent to the other ranks" in first, first
