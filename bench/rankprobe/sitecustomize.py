"""Loaded by every Python process of a benchmark run (PYTHONPATH): records, per rank, which GPU the process
used, its peak memory, each optimizer step's end time (a CUDA event at each step end, read once after train(), so
the probe adds no synchronisation) and label tokens, each DistributedDataParallel construction, when the process
group started, and how often it called generate() and save_pretrained(); written at exit to
$NBDDP_BENCH_PROBE_DIR/rank<RANK>.json, also when the runner stops the launch at its time limit (SIGTERM; the file
then has `terminated_by_signal`). The generated script itself stays as nbddp wrote it.

By environment:
  NBDDP_BENCH_EXIT_AFTER_TRAIN=1 end the process (probe written, exit 0) when the first train() ends
  NBDDP_BENCH_ARGS=k=v,...       set TrainingArguments fields (a lever under test, e.g. dataloader_num_workers=2)
  NBDDP_BENCH_DDP=k=v,...        add DistributedDataParallel keywords (e.g. gradient_as_bucket_view=True)
  NBDDP_BENCH_PEFT=k=v,...       override Unsloth get_peft_model keywords (e.g. use_gradient_checkpointing=True)
  NBDDP_BENCH_FP16=1             the GPU claims no bfloat16, as a T4 (torch and Unsloth's check): dtype=None and
                                 `fp16 = not is_bfloat16_supported()` pick float16
  NBDDP_BENCH_GREEN_SMS=N        a CUDA green context of N SMs on the device the process sets first, one stream of
                                 it made current (after waiting for the work before it) and kept current at every
                                 later set_device (bench/t4_class.py probe checks it; bench/kaggle_t4.py --sms uses
                                 NVIDIA MPS unless --share green)
  NBDDP_BENCH_REWARD=length      GRPO's reward functions replaced by one that random weights earn: the completion's
                                 length in characters / 100 (rewards differ within a group, so advantages do too)
Phases (`phases`: seconds since this process started, each mark's first time; `started_at`: that start on the wall
clock): the process group started (`group`, and `group_ready`), each model load's end (`loaded`, the last one),
the first DDP construction (`ddp`), train begin, first step end, train end, each save's begin and end (`save`,
`saved`: the last one), and the probe's exit (`exit`).
At train begin and end the trainable weights' sum of squares and SHA-256 (`trainable_begin`/`trainable_end`), and
at train end the Trainer's log history (`log_history`), are recorded too.
SIGUSR1 prints every thread's stack (the runner sends it before killing a run that passed its limit)."""
import ast
import atexit
import collections.abc
import dataclasses
import faulthandler
import functools
import importlib.abc
import importlib.util
import json
import os
import signal
import sys
import time

_DIR = os.environ.get("NBDDP_BENCH_PROBE_DIR")
_COUNTS = {"generate": 0, "save_pretrained": 0, "dist_initialized": False}
_T0, _T0P = time.time(), time.perf_counter()  # the process's start on the wall clock and on the step clock
_PID = os.getpid()  # a forked child inherits it: _dump writes only from the process that loaded the probe
_ITEMS = []  # label tokens of the batches loaded since the last optimizer step
_EVENTS = []  # (CUDA event at train begin, its perf_counter), then one event per optimizer-step end


def _mark(name, last=False):
    """A phase reached, in seconds since this process started (the first time, or with `last` the latest)."""
    phases = _COUNTS.setdefault("phases", {})
    if last or name not in phases:
        phases[name] = round(time.time() - _T0, 2)


def _count(name, fn):
    def wrapper(*a, **k):
        _COUNTS[name] += 1
        return fn(*a, **k)
    wrapper.__wrapped__ = fn
    wrapper.__name__ = getattr(fn, "__name__", name)
    wrapper.__doc__ = getattr(fn, "__doc__", None)
    return wrapper


def _patch_callbacks(module):
    handler = module.CallbackHandler
    orig_begin, orig_step, orig_end = handler.on_train_begin, handler.on_step_end, handler.on_train_end

    def on_train_begin(self, args, state, control):
        _mark("train_begin")
        _COUNTS["trainable_begin"] = _trainable(self.model)
        torch = _cuda_torch()
        if torch is not None:
            torch.cuda.synchronize()  # once: the clock's origin, an event and its host time together
            _EVENTS[:] = [(_event(torch), time.perf_counter() - _T0P)]
        return orig_begin(self, args, state, control)

    def on_step_end(self, args, state, control):
        torch = _cuda_torch()
        if torch is not None and _EVENTS:
            _EVENTS.append(_event(torch))  # no wait: the host runs on as it would without the probe
        elif torch is not None:
            torch.cuda.synchronize()  # CUDA started after train() began: no event origin, so host times, synced
        _COUNTS.setdefault("step_end_times", []).append(round(time.perf_counter() - _T0P, 4))
        _mark("first_step")
        if _ITEMS:  # this rank's label tokens of the step
            _COUNTS.setdefault("step_tokens", []).append(sum(_ITEMS))
            _ITEMS.clear()
        _COUNTS["batch"] = {"per_device_train_batch_size": getattr(args, "per_device_train_batch_size", None),
                            "train_batch_size": getattr(args, "train_batch_size", None),  # x GPUs of DataParallel
                            "gradient_accumulation_steps": getattr(args, "gradient_accumulation_steps", None),
                            "world_size": getattr(args, "world_size", None)}
        return orig_step(self, args, state, control)

    def on_train_end(self, args, state, control):
        _mark("train_end", last=True)
        _COUNTS["trainable_end"] = _trainable(self.model)
        _COUNTS["log_history"] = [{k: v for k, v in entry.items() if isinstance(v, (int, float, str))}
                                  for entry in state.log_history]
        out = orig_end(self, args, state, control)
        if os.environ.get("NBDDP_BENCH_EXIT_AFTER_TRAIN") == "1":
            _dump()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return out
    handler.on_train_begin, handler.on_step_end, handler.on_train_end = on_train_begin, on_step_end, on_train_end


def _trainable(model):
    """The trainable weights' sum of squares and SHA-256 of their float32 bytes, in parameter order."""
    try:
        import hashlib
        digest, total, count = hashlib.sha256(), 0.0, 0
        for _, param in sorted(model.named_parameters()):
            if param.requires_grad:
                data = param.detach().float().cpu().contiguous()
                digest.update(data.numpy().tobytes())
                total += float((data.double() ** 2).sum())
                count += data.numel()
        return {"sum_sq": total, "sha256": digest.hexdigest(), "numel": count}
    except Exception as exc:  # the probe never breaks the run
        return {"error": repr(exc)}


def _length_reward(completions, **kwargs):
    """NBDDP_BENCH_REWARD=length: each completion's length in characters / 100 (chat completions: their text)."""
    def text(completion):
        if isinstance(completion, list):
            return "".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in completion)
        return str(completion)
    return [len(text(c)) / 100 for c in completions]


def _patch_trainer(module):
    """NBDDP_BENCH_REWARD=length: a GRPO trainer's reward functions (TRL's, or Unsloth's copy of it) replaced at
    train(), after the notebook built the trainer, whatever class it is."""
    if os.environ.get("NBDDP_BENCH_REWARD") != "length":
        return
    train = module.Trainer.train

    @functools.wraps(train)
    def patched_train(self, *a, **k):
        if getattr(self, "reward_funcs", None) is not None:
            import torch
            self.reward_funcs = [_length_reward]
            self.reward_func_names = ["length_reward"]
            self.reward_processing_classes = [None]
            self.reward_weights = torch.ones(1, dtype=torch.float32)
            _COUNTS["reward"] = "length"
        return train(self, *a, **k)
    module.Trainer.train = patched_train


def _timed(name, fn):
    """Marks `name` (last) as `fn` begins and `name`+"ed"/"d" as it ends."""
    done = "loaded" if name == "load" else "saved"

    @functools.wraps(fn)
    def timed(*a, **k):
        if name != "load":
            _mark(name, last=True)
        try:
            return fn(*a, **k)
        finally:
            _mark(done, last=True)
    return timed


def _patch_loader(module):
    """Counts the label tokens (labels != -100) of every batch accelerate's loader moves to the GPU, on the CPU
    before the move: no device sync. on_step_end files the count under the step."""
    orig = module.send_to_device

    @functools.wraps(orig)
    def send_to_device(batch, *a, **k):
        labels = batch.get("labels") if isinstance(batch, collections.abc.Mapping) else None  # BatchEncoding too
        if labels is not None and getattr(labels, "device", None) is not None and labels.device.type == "cpu":
            _ITEMS.append(int((labels != -100).sum()))
        return orig(batch, *a, **k)
    module.send_to_device = send_to_device


def _cuda_torch():
    """torch, where this process has started CUDA; otherwise None."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized() else None


def _event(torch):
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


def _step_times_from_events(torch):
    """After training: each step end on the GPU's clock (the event), placed on the probe's host clock through the
    train-begin event; replaces the host times, which run ahead of the GPU when nothing waits for it."""
    if len(_EVENTS) < 2 or len(_EVENTS) - 1 != len(_COUNTS.get("step_end_times", [])):
        return
    torch.cuda.synchronize()
    (origin, at), ends = _EVENTS[0], _EVENTS[1:]
    _COUNTS["step_end_host_times"] = _COUNTS["step_end_times"]
    _COUNTS["step_end_times"] = [round(at + origin.elapsed_time(ev) / 1000, 4) for ev in ends]
    _COUNTS["step_timing"] = "cuda-events"
    _EVENTS.clear()


def _settings(name):
    """NBDDP_BENCH_ARGS / NBDDP_BENCH_DDP / NBDDP_BENCH_PEFT: k=v pairs, values read as Python literals where they
    are one."""
    out = {}
    for item in filter(None, os.environ.get(name, "").split(",")):
        key, _, value = item.partition("=")
        try:
            out[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = value.strip()
    return out


def _patch_training_args(module):
    """The levers under test that are TrainingArguments fields, set before the arguments are checked."""
    cls = module.TrainingArguments
    orig = cls.__post_init__
    fields = {f.name for f in dataclasses.fields(cls)}

    @functools.wraps(orig)
    def __post_init__(self, *a, **k):
        for key, value in _settings("NBDDP_BENCH_ARGS").items():
            if key not in fields:
                print(f"rankprobe: TrainingArguments has no field {key}; not set", file=sys.stderr)
                continue
            setattr(self, key, value)
            _COUNTS.setdefault("bench_args", {})[key] = value
        return orig(self, *a, **k)
    cls.__post_init__ = __post_init__


def _patch_ddp(module):
    """At each DistributedDataParallel construction: where the wrapped module's buffers live (DDP broadcasts
    them from rank 0 at construction and, with broadcast_buffers, before every forward), the settings it got,
    and memory (allocated, running peak) before and after it."""
    cls = module.DistributedDataParallel
    orig = cls.__init__

    @functools.wraps(orig)  # keeps the signature visible (nbddp's layer reads it)
    def __init__(self, mod, *a, **k):
        import torch
        devices = {}
        for _, buf in mod.named_buffers():
            devices[str(buf.device)] = devices.get(str(buf.device), 0) + 1
        gib = lambda: (round(torch.cuda.memory_allocated() / 2**30, 3), round(torch.cuda.max_memory_allocated() / 2**30, 3))
        record = {"buffers_by_device": devices, "broadcast_buffers": k.get("broadcast_buffers", True),
                  "static_graph": k.get("static_graph", False),
                  "find_unused_parameters": k.get("find_unused_parameters", False),
                  "trainable_params": sum(p.numel() for p in mod.parameters() if p.requires_grad),
                  "all_params": sum(p.numel() for p in mod.parameters())}
        extra = _settings("NBDDP_BENCH_DDP")
        k.update(extra)
        record["bench_ddp"] = extra
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            record["memory_before_gib"] = gib()
        _COUNTS.setdefault("ddp_constructed", []).append(record)
        _mark("ddp")
        out = orig(self, mod, *a, **k)
        if "memory_before_gib" in record:
            record["memory_after_gib"] = gib()
        return out
    cls.__init__ = __init__


def _patch_unsloth_peft(module):
    """NBDDP_BENCH_PEFT: the notebook's FastLanguageModel.get_peft_model keywords overridden (it calls this one)."""
    extra = _settings("NBDDP_BENCH_PEFT")
    if not extra:
        return
    orig = module.FastLlamaModel.get_peft_model

    @functools.wraps(orig)
    def get_peft_model(*a, **k):
        k.update(extra)
        _COUNTS["bench_peft"] = extra
        return orig(*a, **k)
    module.FastLlamaModel.get_peft_model = staticmethod(get_peft_model)


def _patch_dist(module):
    """When the process group starts, and whether `unsloth` was imported by then (unsloth-zoo#967)."""
    orig = module.init_process_group

    def init(*a, **k):
        _COUNTS["dist_initialized"] = True
        _COUNTS["dist_init_after_s"] = round(time.time() - _T0, 1)
        _COUNTS["unsloth_imported_before_init"] = "unsloth" in sys.modules
        _mark("group")
        out = orig(*a, **k)
        _mark("group_ready")
        return out
    module.init_process_group = init


def _no_bf16(module):
    """NBDDP_BENCH_FP16: torch (torch.cuda) and Unsloth (unsloth.models._utils) see a GPU without bfloat16."""
    if os.environ.get("NBDDP_BENCH_FP16") != "1":
        return
    if hasattr(module, "is_bf16_supported"):
        module.is_bf16_supported = lambda *a, **k: False
    if hasattr(module, "SUPPORTS_BFLOAT16"):
        module.SUPPORTS_BFLOAT16, module._BF16_BY_DEVICE = False, None
    _COUNTS["bench_fp16"] = True


_GREEN = {}  # device index -> (green context, the one stream of it this process runs on)


def _green(module):
    """NBDDP_BENCH_GREEN_SMS: every set_device leaves this process's current stream on the green context of that
    device, made once (one stream: a new stream per call would leave the calls' work unordered)."""
    sms = os.environ.get("NBDDP_BENCH_GREEN_SMS")
    if not sms:
        return
    orig = module.set_device

    @functools.wraps(orig)
    def set_device(device):
        orig(device)
        torch = sys.modules["torch"]
        index = torch.cuda.current_device()
        if index not in _GREEN:
            ctx = torch.cuda.green_contexts.GreenContext.create(num_sms=int(sms), device_id=index)
            _GREEN[index] = (ctx, ctx.Stream())
            _COUNTS["green_sms"] = int(sms)
        stream, current = _GREEN[index][1], torch.cuda.current_stream(index)
        if current != stream:
            stream.wait_stream(current)
            torch.cuda.set_stream(stream)
    module.set_device = set_device


_PATCH = {
    "torch.cuda": lambda m: (_no_bf16(m), _green(m)),
    "unsloth.models._utils": _no_bf16,
    "torch.distributed": _patch_dist,
    "torch.nn.parallel.distributed": _patch_ddp,
    "transformers.trainer_callback": _patch_callbacks,
    "transformers.training_args": _patch_training_args,
    "accelerate.data_loader": _patch_loader,
    "transformers.trainer": _patch_trainer,
    "unsloth.models.llama": _patch_unsloth_peft,
    "transformers.generation.utils": lambda m: setattr(m.GenerationMixin, "generate", _count("generate", m.GenerationMixin.generate)),
    "peft.peft_model": lambda m: setattr(m.PeftModel, "save_pretrained", _timed("save", _count("save_pretrained", m.PeftModel.save_pretrained))),
    "transformers.modeling_utils": lambda m: setattr(m.PreTrainedModel, "from_pretrained", classmethod(_timed("load", m.PreTrainedModel.from_pretrained.__func__))),
}


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _PATCH:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        orig = loader.exec_module

        def exec_module(module):
            orig(module)
            try:
                _PATCH[name](module)
            except Exception as exc:  # probe must never break the run
                print(f"rankprobe: could not patch {name}: {exc}", file=sys.stderr)
        loader.exec_module = exec_module
        return spec


def _dump():
    if os.getpid() != _PID:
        return  # a forked child (a dataloader worker): the rank's argv and a stale copy of its counts
    script = os.environ.get("NBDDP_BENCH_SCRIPT")  # set by the runner: only the script's own processes write
    if script and os.path.abspath(sys.argv[0] if sys.argv else "") != script:
        return  # a helper process (compile workers, ...) that would overwrite the rank's file
    argv0 = (sys.argv[0] if sys.argv else "").replace(os.sep, "/")
    if "RANK" not in os.environ and (argv0.endswith("torch/distributed/run.py") or argv0.endswith("/torchrun")):
        return  # the torchrun launcher itself
    rank = os.environ.get("RANK", "0")
    torch = _cuda_torch()
    try:
        if torch:
            _step_times_from_events(torch)  # before the record below is taken from _COUNTS
    except Exception as exc:
        _COUNTS["probe_error"] = repr(exc)
    _mark("exit")
    info = dict(_COUNTS, started_at=_T0, rank=int(rank), local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                world_size=int(os.environ.get("WORLD_SIZE", "1")),
                cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), seconds=round(time.time() - _T0, 1))
    try:
        if torch:
            dev = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(dev)
            info.update(cuda_device=dev, gpu_name=props.name, gpu_uuid=str(getattr(props, "uuid", "")),
                        peak_allocated_gib=round(torch.cuda.max_memory_allocated(dev) / 2**30, 3),
                        peak_reserved_gib=round(torch.cuda.max_memory_reserved(dev) / 2**30, 3),
                        peak_reserved_gib_per_gpu=[round(torch.cuda.max_memory_reserved(d) / 2**30, 3)
                                                   for d in range(torch.cuda.device_count())])
    except Exception as exc:
        info["probe_error"] = repr(exc)
    with open(os.path.join(_DIR, f"rank{rank}.json"), "w") as fh:
        json.dump(info, fh)


def _on_terminate(signum, frame):
    """A launch stopped at its time limit (the runner sends SIGTERM) still leaves the steps it measured, marked."""
    signal.signal(signum, signal.SIG_IGN)  # the launcher's own SIGTERM to its workers may follow the runner's
    _COUNTS["terminated_by_signal"] = signum
    _dump()
    os._exit(128 + signum)


if _DIR:
    os.makedirs(_DIR, exist_ok=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGTERM, _on_terminate)  # torchrun's launcher sets its own later; the ranks keep this
    sys.meta_path.insert(0, _Finder())
    atexit.register(_dump)
