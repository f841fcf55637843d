"""Loaded by every Python process of a benchmark run (PYTHONPATH): records, per rank, which GPU the process
used, its peak memory, and how often it called generate() and save_pretrained(); written at exit to
$NBDDP_BENCH_PROBE_DIR/rank<RANK>.json. The generated script itself stays as nbddp wrote it."""
import atexit
import importlib.abc
import importlib.util
import json
import os
import sys
import time

_DIR = os.environ.get("NBDDP_BENCH_PROBE_DIR")
_COUNTS = {"generate": 0, "save_pretrained": 0, "dist_initialized": False}
_T0 = time.time()


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

    def on_step_end(self, args, state, control):
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        _COUNTS.setdefault("step_end_times", []).append(round(time.perf_counter() - _T0P, 4))
        _COUNTS["batch"] = {"per_device_train_batch_size": getattr(args, "per_device_train_batch_size", None),
                            "gradient_accumulation_steps": getattr(args, "gradient_accumulation_steps", None),
                            "world_size": getattr(args, "world_size", None)}
        return orig(self, args, state, control)
    handler.on_step_end = on_step_end


def _patch_ddp(module):
    """At each DistributedDataParallel construction: where the wrapped module's buffers live (DDP broadcasts
    them from rank 0 at construction and, with broadcast_buffers, before every forward)."""
    cls = module.DistributedDataParallel
    orig = cls.__init__

    def __init__(self, mod, *a, **k):
        devices = {}
        for _, buf in mod.named_buffers():
            devices[str(buf.device)] = devices.get(str(buf.device), 0) + 1
        _COUNTS.setdefault("ddp_constructed", []).append(
            {"buffers_by_device": devices, "broadcast_buffers": k.get("broadcast_buffers", True),
             "static_graph": k.get("static_graph", False),
             "find_unused_parameters": k.get("find_unused_parameters", False)})
        return orig(self, mod, *a, **k)
    cls.__init__ = __init__


def _patch_dist(module):
    """When the process group starts, and whether `unsloth` was imported by then (unsloth-zoo#967)."""
    orig = module.init_process_group

    def init(*a, **k):
        _COUNTS["dist_initialized"] = True
        _COUNTS["dist_init_after_s"] = round(time.time() - _T0, 1)
        _COUNTS["unsloth_imported_before_init"] = "unsloth" in sys.modules
        return orig(*a, **k)
    module.init_process_group = init


_T0P = time.perf_counter()
_PATCH = {
    "torch.distributed": _patch_dist,
    "torch.nn.parallel.distributed": _patch_ddp,
    "transformers.trainer_callback": _patch_callbacks,
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
    argv0 = (sys.argv[0] if sys.argv else "").replace(os.sep, "/")
    if "RANK" not in os.environ and (argv0.endswith("torch/distributed/run.py") or argv0.endswith("/torchrun")):
        return  # the torchrun launcher itself
    rank = os.environ.get("RANK", "0")
    info = dict(_COUNTS, rank=int(rank), local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                world_size=int(os.environ.get("WORLD_SIZE", "1")),
                cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"), seconds=round(time.time() - _T0, 1))
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            dev = torch.cuda.current_device()
            props = torch.cuda.get_device_properties(dev)
            info.update(cuda_device=dev, gpu_name=props.name, gpu_uuid=str(getattr(props, "uuid", "")),
                        peak_allocated_gib=round(torch.cuda.max_memory_allocated(dev) / 2**30, 3),
                        peak_reserved_gib=round(torch.cuda.max_memory_reserved(dev) / 2**30, 3))
    except Exception as exc:
        info["probe_error"] = repr(exc)
    with open(os.path.join(_DIR, f"rank{rank}.json"), "w") as fh:
        json.dump(info, fh)


if _DIR:
    os.makedirs(_DIR, exist_ok=True)
    sys.meta_path.insert(0, _Finder())
    atexit.register(_dump)
