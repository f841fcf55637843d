"""Loaded by every Python process of a benchmark run (PYTHONPATH): records, per rank, which GPU the process
used, its peak memory, each optimizer step's end time and label tokens, the training thread's CPU time,
involuntary context switches and CPU at each step end (CPU time and switches of the whole process too), and how
often it called generate() and save_pretrained(); written at exit to $NBDDP_BENCH_PROBE_DIR/rank<RANK>.json,
also when the runner stops the launch at its time limit (SIGTERM; the file then has `terminated_by_signal`).
The generated script itself stays as nbddp wrote it.

Optional, by environment (benchmark diagnostics, never on in a timed run):
  NBDDP_BENCH_PROFILE=A:B        torch.profiler over optimizer steps A..B-1; per-rank tables, profile-rank<R>.txt
  NBDDP_BENCH_TRACE=1            with PROFILE: also the window's timeline, trace-rank<R>.json.gz (chrome://tracing)
  NBDDP_BENCH_SYNC_DEBUG=A       every host<-GPU synchronisation during optimizer step A+1, with the Python
                                 stack that asked for it (torch.cuda.set_sync_debug_mode), syncs-rank<R>.txt
  NBDDP_BENCH_STEP_SYNC=1        time steps by synchronising CUDA at each step end (the probe before the sixth
                                 session); by default a CUDA event marks each step end, read once after train()
  NBDDP_BENCH_MEMORY_HISTORY=N   CUDA allocator history from train start to step N, memory-rank<R>.pickle.gz
  NBDDP_BENCH_EXIT_AFTER_TRAIN=1 end the process (probe written, exit 0) when the first train() ends
  NBDDP_BENCH_ARGS=k=v,...       set TrainingArguments fields (a lever under test, e.g. dataloader_num_workers=2)
  NBDDP_BENCH_DDP=k=v,...        add DistributedDataParallel keywords (e.g. gradient_as_bucket_view=True)
  NBDDP_BENCH_PEFT=k=v,...       override Unsloth get_peft_model keywords (e.g. use_gradient_checkpointing=True)
  NBDDP_BENCH_CPUS=a,b;c,d       pin each process at start to the CPU group of its LOCAL_RANK (0 without one);
                                 threads it starts later inherit the set
SIGUSR1 prints every thread's stack (the runner sends it before killing a run that passed its limit)."""
import ast
import atexit
import collections.abc
import dataclasses
import faulthandler
import functools
import gzip
import importlib.abc
import importlib.util
import json
import os
import pickle
import resource
import signal
import sys
import time

_DIR = os.environ.get("NBDDP_BENCH_PROBE_DIR")
_COUNTS = {"generate": 0, "save_pretrained": 0, "dist_initialized": False}
_T0, _T0P = time.time(), time.perf_counter()  # the process's start on the wall clock and on the step clock
_PID = os.getpid()  # a forked child inherits it: _dump writes only from the process that loaded the probe
_ITEMS = []  # label tokens of the batches loaded since the last optimizer step
_PROFILER = {}  # the running torch.profiler, between the window's first and last step
_EVENTS = []  # (CUDA event at train begin, its perf_counter), then one event per optimizer-step end


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
    orig = handler.on_step_end

    orig_begin = handler.on_train_begin

    def on_train_begin(self, args, state, control):
        torch = sys.modules.get("torch")
        if _HISTORY_UNTIL and torch is not None and torch.cuda.is_available():
            torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
        if not _STEP_SYNC and _cuda_torch():
            torch.cuda.synchronize()  # once: the clock's origin, an event and its host time together
            _EVENTS[:] = [(_event(torch), time.perf_counter() - _T0P)]
        return orig_begin(self, args, state, control)

    def on_step_end(self, args, state, control):
        torch = _cuda_torch()
        cuda = torch is not None
        if cuda and (_STEP_SYNC or not _EVENTS):
            torch.cuda.synchronize()
        elif cuda:
            _EVENTS.append(_event(torch))  # no wait: the host runs on as it would without the probe
        _COUNTS.setdefault("step_end_times", []).append(round(time.perf_counter() - _T0P, 4))
        step = len(_COUNTS["step_end_times"])
        _host_step()
        if cuda and _SYNC_DEBUG and step in (_SYNC_DEBUG, _SYNC_DEBUG + 1):
            _sync_debug(torch, on=step == _SYNC_DEBUG)
        if cuda:
            try:
                _diagnose_step(torch, step)
            except Exception as exc:  # the probe must never break the run
                print(f"rankprobe: step {step}: {exc!r}", file=sys.stderr)
        if _ITEMS:  # this rank's label tokens of the step
            _COUNTS.setdefault("step_tokens", []).append(sum(_ITEMS))
            _ITEMS.clear()
        _COUNTS["batch"] = {"per_device_train_batch_size": getattr(args, "per_device_train_batch_size", None),
                            "train_batch_size": getattr(args, "train_batch_size", None),  # x GPUs of DataParallel
                            "gradient_accumulation_steps": getattr(args, "gradient_accumulation_steps", None),
                            "world_size": getattr(args, "world_size", None)}
        return orig(self, args, state, control)
    orig_end = handler.on_train_end

    def on_train_end(self, args, state, control):
        out = orig_end(self, args, state, control)
        if os.environ.get("NBDDP_BENCH_EXIT_AFTER_TRAIN") == "1":
            _dump()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        return out
    handler.on_step_end = on_step_end
    handler.on_train_begin = on_train_begin
    handler.on_train_end = on_train_end


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


def _host_step():
    """The training thread's side of each step: its CPU seconds so far, involuntary context switches so far (the
    kernel took the CPU away), and the CPU it last ran on; and the same two counts for the whole process, whose
    other threads include the autograd engine's, which runs each backward pass while the training thread waits.
    Whether a slower step did more host work, waited, or was crowded off its CPU."""
    usage = resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF))
    process = resource.getrusage(resource.RUSAGE_SELF)  # summed over the process's threads
    cpu = None
    try:
        with open("/proc/thread-self/stat") as fh:
            cpu = int(fh.read().rsplit(")", 1)[1].split()[36])  # field 39, 'processor'
    except (OSError, ValueError, IndexError):
        pass
    for key, value in (("step_thread_cpu_s", round(time.thread_time(), 4)),
                       ("step_involuntary_switches", usage.ru_nivcsw), ("step_cpu", cpu),
                       ("step_process_cpu_s", round(time.process_time(), 4)),
                       ("step_process_involuntary_switches", process.ru_nivcsw)):
        _COUNTS.setdefault(key, []).append(value)


def _rank_file(kind, ext):
    """This rank's file of one kind in the probe's folder, e.g. profile-rank1.txt."""
    return os.path.join(_DIR, f"{kind}-rank{os.environ.get('RANK', '0')}.{ext}")


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


def _sync_debug(torch, on):
    """Each synchronising CUDA call of one step, with the Python frames that made it (torch warns for each)."""
    import traceback
    import warnings
    if not on:
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = _SYNC_LOG.pop("showwarning", warnings.showwarning)
        warnings.filters[:] = _SYNC_LOG.pop("filters", warnings.filters)
        return
    path = _rank_file("syncs", "txt")
    orig = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return orig(message, category, filename, lineno, file, line)
        frames = [f for f in traceback.extract_stack()[:-1] if "warnings.py" not in f.filename][-8:]
        with open(path, "a") as fh:
            fh.write(f"-- {message}\n" + "".join(traceback.format_list(frames)))
    _SYNC_LOG.update(showwarning=orig, filters=list(warnings.filters))
    warnings.showwarning = show
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")


def _diagnose_step(torch, step):
    """Memory held after the step and the running peak (which step set it); the optional profiler window and
    allocator history."""
    _COUNTS.setdefault("step_memory_gib", []).append(
        (round(torch.cuda.memory_allocated() / 2**30, 3), round(torch.cuda.max_memory_allocated() / 2**30, 3)))
    if _PROFILE:
        _profile_step(torch, step)
    if _HISTORY_UNTIL and step == _HISTORY_UNTIL:
        with gzip.open(_rank_file("memory", "pickle.gz"), "wb") as fh:
            pickle.dump(torch.cuda.memory._snapshot(), fh)
        torch.cuda.memory._record_memory_history(enabled=None)


def _profile_step(torch, step):
    """Start torch.profiler after step A ends, stop after step B ends; write the tables of that window."""
    start, stop = _PROFILE
    if step == start:
        _PROFILER["on"] = prof = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
        prof.__enter__()
    elif step == stop and "on" in _PROFILER:
        prof = _PROFILER.pop("on")
        prof.__exit__(None, None, None)
        avg = prof.key_averages()
        if os.environ.get("NBDDP_BENCH_TRACE") == "1":
            trace = _rank_file("trace", "json")
            prof.export_chrome_trace(trace)
            with open(trace, "rb") as src, gzip.open(trace + ".gz", "wb") as dst:
                dst.write(src.read())
            os.remove(trace)
        with open(_rank_file("profile", "txt"), "w") as fh:
            fh.write(f"optimizer steps {start + 1}..{stop} (1-based), {stop - start} steps\n")
            for key in ("self_device_time_total", "self_cpu_time_total", "cpu_time_total"):
                try:
                    fh.write(f"\n== sorted by {key}\n" + avg.table(sort_by=key, row_limit=40, max_name_column_width=70))
                except Exception as exc:  # the key's name differs between torch versions
                    fh.write(f"\n== {key}: {exc!r}\n")


def _settings(name):
    """NBDDP_BENCH_ARGS / NBDDP_BENCH_DDP: k=v pairs, values read as Python literals where they are one."""
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
    them from rank 0 at construction and, with broadcast_buffers, before every forward)."""
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
            record["memory_before_gib"] = gib()  # (allocated, running peak)
        _COUNTS.setdefault("ddp_constructed", []).append(record)
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
        return orig(*a, **k)
    module.init_process_group = init


_COUNTS["clock_origin_epoch"] = round(_T0, 3)  # wall clock at step_end_times' zero (for GPU clock samples)
_PROFILE = tuple(int(x) for x in os.environ["NBDDP_BENCH_PROFILE"].split(":")) if os.environ.get("NBDDP_BENCH_PROFILE") else None
_HISTORY_UNTIL = int(os.environ.get("NBDDP_BENCH_MEMORY_HISTORY") or 0)
_STEP_SYNC = os.environ.get("NBDDP_BENCH_STEP_SYNC") == "1"
_SYNC_DEBUG = int(os.environ.get("NBDDP_BENCH_SYNC_DEBUG") or 0)
_SYNC_LOG = {}
_PATCH = {
    "torch.distributed": _patch_dist,
    "torch.nn.parallel.distributed": _patch_ddp,
    "transformers.trainer_callback": _patch_callbacks,
    "transformers.training_args": _patch_training_args,
    "accelerate.data_loader": _patch_loader,
    "unsloth.models.llama": _patch_unsloth_peft,
    "transformers.generation.utils": lambda m: setattr(m.GenerationMixin, "generate", _count("generate", m.GenerationMixin.generate)),
    "peft.peft_model": lambda m: setattr(m.PeftModel, "save_pretrained", _count("save_pretrained", m.PeftModel.save_pretrained)),
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
    info = dict(_COUNTS, rank=int(rank), local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                world_size=int(os.environ.get("WORLD_SIZE", "1")),
                cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), seconds=round(time.time() - _T0, 1))
    try:
        if torch:
            dev = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(dev)
            info.update(cuda_device=dev, gpu_name=props.name, gpu_uuid=str(getattr(props, "uuid", "")),
                        peak_allocated_gib=round(torch.cuda.max_memory_allocated(dev) / 2**30, 3),
                        peak_reserved_gib=round(torch.cuda.max_memory_reserved(dev) / 2**30, 3))
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


def _pin():
    groups = os.environ.get("NBDDP_BENCH_CPUS")
    if groups:
        cpus = {int(c) for c in groups.split(";")[int(os.environ.get("LOCAL_RANK", "0"))].split(",")}
        os.sched_setaffinity(0, cpus)
        _COUNTS["pinned_cpus"] = sorted(cpus)


if _DIR:
    _pin()
    os.makedirs(_DIR, exist_ok=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGTERM, _on_terminate)  # torchrun's launcher sets its own later; the ranks keep this
    sys.meta_path.insert(0, _Finder())
    atexit.register(_dump)
