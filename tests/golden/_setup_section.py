# ---- nbddp: one process per GPU, started by torchrun (no notebook code above this line) ----
import contextlib
import os
import subprocess
import sys

import torch
import torch.distributed

NBDDP_RANK = int(os.environ.get("RANK", "0"))
NBDDP_LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
NBDDP_WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
NBDDP_IS_MAIN = NBDDP_RANK == 0  # saving, pushing, generation and prints: once per job
NBDDP_IS_LOCAL_MAIN = NBDDP_LOCAL_RANK == 0  # files and caches: once per machine


if torch.cuda.is_available():
    torch.cuda.set_device(NBDDP_LOCAL_RANK)  # plain "cuda" now means this rank's own GPU
    NBDDP_DEVICE = f"cuda:{NBDDP_LOCAL_RANK}"
else:
    NBDDP_DEVICE = "cpu"
    if NBDDP_WORLD_SIZE > 1:
        # Without it, Hugging Face's Trainer on a machine without GPUs ignores torchrun: every rank trains alone.
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")


def nbddp_device_map():
    """The whole model on this rank's own device."""
    return {"": NBDDP_DEVICE}


def nbddp_dist():
    """True when running distributed. The process group starts at first use, after the notebook's own imports."""
    if NBDDP_WORLD_SIZE == 1 or not torch.distributed.is_available():
        return False
    if not torch.distributed.is_initialized():
        if torch.cuda.is_available():
            torch.distributed.init_process_group("nccl", device_id=torch.device(NBDDP_DEVICE))
        else:
            torch.distributed.init_process_group("gloo")
    return True


def nbddp_barrier():
    """Wait until every rank gets here."""
    if nbddp_dist():
        if torch.distributed.get_backend() == "nccl":
            torch.distributed.barrier(device_ids=[NBDDP_LOCAL_RANK])
        else:
            torch.distributed.barrier()


@contextlib.contextmanager
def nbddp_main_process_first():
    """Local rank 0 runs the block first (and fills the datasets cache); the others run it after."""
    if not NBDDP_IS_LOCAL_MAIN:
        nbddp_barrier()
    yield
    if NBDDP_IS_LOCAL_MAIN:
        nbddp_barrier()


def nbddp_shell(command, shell=True):
    """A notebook `!command`: runs once per machine (local rank 0) while the other ranks wait."""
    if NBDDP_IS_LOCAL_MAIN:
        sys.stdout.flush()
        done = subprocess.run(command, shell=True, executable=None if shell is True else shell)
        if done.returncode:
            print(f"nbddp: shell command exited with status {done.returncode}: {command}", file=sys.stderr)
    nbddp_barrier()


def nbddp_getoutput(command):
    """A notebook `x = !command`: the output lines."""
    done = subprocess.run(command, shell=True, capture_output=True, text=True)
    return (done.stdout + done.stderr).splitlines()


def nbddp_write_file(path, text, append=False):
    """A notebook `%%writefile` cell: written once per machine, the other ranks wait."""
    if NBDDP_IS_LOCAL_MAIN:
        with open(path, "a" if append else "w", encoding="utf-8") as fh:
            fh.write(text)
    nbddp_barrier()


def nbddp_teardown():
    """Wait for every rank, then close the process group; a rank that failed skips the wait."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if sys.exc_info()[0] is None:
            nbddp_barrier()
        torch.distributed.destroy_process_group()


if NBDDP_IS_MAIN and NBDDP_WORLD_SIZE > 1:
    print(f"nbddp: {NBDDP_WORLD_SIZE} processes, this one is rank 0 on {NBDDP_DEVICE}", flush=True)
# ---- end of nbddp setup ----


# ---- nbddp: DDP compatibility layer (libraries are patched when the notebook imports them, never before) ----
import functools
import importlib.abc
import inspect
import itertools
import warnings

_NBDDP_SAID = set()


def nbddp_say(key, text):
    """One line on rank 0, once per key."""
    if key not in _NBDDP_SAID:
        _NBDDP_SAID.add(key)
        if NBDDP_IS_MAIN:
            print(f"nbddp: {text}", flush=True)


def _nbddp_choice(name):
    """NBDDP_* override: auto (None), 1 (True) or 0 (False)."""
    value = os.environ.get(name, "auto").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    return None


def _nbddp_flag(name):
    return _nbddp_choice(name) is True


class _NbddpPostImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs patch functions right after a watched module is first imported (a sys.meta_path hook)."""

    def __init__(self):
        self.hooks = {}
        self.busy = set()

    def watch(self, name, patch):
        if name in sys.modules:
            self._run(name, sys.modules[name], [patch])
        else:
            self.hooks.setdefault(name, []).append(patch)

    def find_spec(self, name, path=None, target=None):
        if name not in self.hooks or name in self.busy:
            return None
        self.busy.add(name)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.busy.discard(name)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        inner, hooks = spec.loader, self.hooks.pop(name)
        finder = self

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return inner.create_module(spec)

            def exec_module(self, module):
                inner.exec_module(module)
                finder._run(name, module, hooks)

            def __getattr__(self, attr):
                return getattr(inner, attr)

        spec.loader = _Loader()
        return spec

    @staticmethod
    def _run(name, module, hooks):
        for patch in hooks:
            try:
                patch(module)
            except Exception as exc:  # a patch must never break the notebook's import
                nbddp_say(f"patch-failed-{name}-{patch.__name__}",
                          f"{patch.__name__} skipped for {name} ({type(exc).__name__}: {exc})")


NBDDP_IMPORTS = _NbddpPostImport()
sys.meta_path.insert(0, NBDDP_IMPORTS)


# ---- 1. DDP graph strategy from the gradient-checkpointing mode ----
def _nbddp_children(obj):
    for attr in ("module", "base_model", "model", "_orig_mod"):
        child = getattr(obj, attr, None)
        if isinstance(child, torch.nn.Module) and child is not obj:
            yield child


def nbddp_find_module(model, test, depth=8):
    """The first object in the wrapping chain (DDP, accelerate, PEFT, torch.compile) that passes `test`; bounded."""
    seen, layer = set(), [model]
    for _ in range(depth):
        nxt = []
        for obj in layer:
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if test(obj):
                return obj
            nxt.extend(_nbddp_children(obj))
        if not nxt:
            return None
        layer = nxt
    return None


def _nbddp_checkpoint_kind(func):
    """'unsloth', 'reentrant' or 'non-reentrant' for a model's _gradient_checkpointing_func."""
    inner, keywords = func, {}
    for _ in range(4):
        if isinstance(inner, functools.partial):
            keywords = {**inner.keywords, **keywords}
            inner = inner.func
        else:
            break
    if getattr(inner, "_nbddp_offload", False):
        return "non-reentrant"
    where = f"{getattr(inner, '__module__', '')}.{getattr(inner, '__qualname__', '')}".lower()
    if "unsloth" in where:
        return "unsloth"
    reentrant = keywords.get("use_reentrant")
    if reentrant is None:  # torch.utils.checkpoint's own default is reentrant
        try:
            reentrant = inspect.signature(inner).parameters["use_reentrant"].default
        except (TypeError, ValueError, KeyError):
            reentrant = True
        reentrant = True if reentrant in (None, inspect.Parameter.empty) else bool(reentrant)
    return "reentrant" if reentrant else "non-reentrant"


def nbddp_checkpointing_mode(model, args=None):
    """'none', 'reentrant', 'non-reentrant' or 'unsloth' (Unsloth's offloaded checkpointing, which is reentrant)."""
    found = set()
    base = nbddp_find_module(model, lambda m: not _nbddp_is_wrapper(m)) or model
    for module in base.modules():
        if getattr(module, "gradient_checkpointing", False) is True:
            func = getattr(module, "_gradient_checkpointing_func", None)
            found.add(_nbddp_checkpoint_kind(func) if func is not None else "reentrant")
    if not found and args is not None and (getattr(args, "gradient_checkpointing", False)
                                           or getattr(args, "activation_checkpointing", False)):
        kwargs = (getattr(args, "gradient_checkpointing_kwargs", None)
                  or getattr(args, "activation_checkpointing_kwargs", None) or {"use_reentrant": False})
        found.add("reentrant" if kwargs.get("use_reentrant", False) else "non-reentrant")
    if not found and _nbddp_flag("UNSLOTH_USE_GRADIENT_CHECKPOINTING"):
        found.add("unsloth")
    for mode in ("unsloth", "reentrant", "non-reentrant"):
        if mode in found:
            return mode
    return "none"


def _nbddp_is_wrapper(module):
    name = type(module).__name__
    return name in ("DistributedDataParallel", "OptimizedModule") or name.startswith("Peft")


def nbddp_ddp_strategy(mode, all_used=True):
    """(static_graph, find_unused_parameters, use_non_reentrant, reason) for a checkpointing mode.

    Reentrant checkpointing re-runs the forward inside backward: DDP then sees parameters either as unused
    (find_unused_parameters=True marks them ready at the end of forward, and again in backward) or as used
    twice; a static graph records the real pattern in the first step and replays it. A static graph breaks when
    the set of used parameters changes between steps, so when some parameters may be unused, reentrant
    checkpointing is swapped for non-reentrant checkpointing (activations offloaded to CPU where the original
    offloaded them), which DDP follows exactly, with find_unused_parameters=True.
    """
    static, find_unused, swap = False, not all_used, False
    if mode in ("reentrant", "unsloth"):
        if all_used:
            # find_unused_parameters=False alone cures "marked ready twice" here. A static graph is left off: with
            # Unsloth 2026.10's checkpointing it failed at the first backward on 2 GPUs (reducer INTERNAL ASSERT
            # expect_autograd_hooks_; bench/results/notebooks-2026-11-26.json), and it brings nothing when every
            # parameter is used.
            why = f"{mode} gradient checkpointing, every trainable parameter used"
        else:
            swap, why = True, f"{mode} gradient checkpointing with parameters unused in some steps: " \
                              "switched to non-reentrant checkpointing"
    elif mode == "non-reentrant":
        why = "non-reentrant gradient checkpointing"
    else:
        why = "no gradient checkpointing"
    if not all_used and not swap:
        why += ", some trainable parameters unused in some steps"
    forced = _nbddp_choice("NBDDP_STATIC_GRAPH")
    if forced is None and _nbddp_flag("UNSLOTH_DISABLE_DDP_STATIC_GRAPH"):
        forced, alias = False, "UNSLOTH_DISABLE_DDP_STATIC_GRAPH"
    elif forced is None and mode != "none" and _nbddp_flag("UNSLOTH_DISABLE_DDP_STATIC_GRAPH_FOR_GRAD_CHECKPOINT"):
        forced, alias = False, "UNSLOTH_DISABLE_DDP_STATIC_GRAPH_FOR_GRAD_CHECKPOINT"
    else:
        alias = "NBDDP_STATIC_GRAPH"
    if forced is not None:
        static, why = forced, f"{why}; static_graph set by {alias}"
        if not forced and mode in ("reentrant", "unsloth") and all_used:
            find_unused = False
    forced = _nbddp_choice("NBDDP_FIND_UNUSED")
    if forced is not None:
        find_unused, why = forced, f"{why}; find_unused_parameters set by NBDDP_FIND_UNUSED"
    return static, find_unused, swap, why


def _nbddp_all_used(args):
    """Whether every trainable parameter gets a gradient every step: NBDDP_FIND_UNUSED, then the notebook's own
    ddp_find_unused_parameters=True, else yes (LoRA adapters are all used every step)."""
    forced = _nbddp_choice("NBDDP_FIND_UNUSED")
    if forced is not None:
        return not forced
    return getattr(args, "ddp_find_unused_parameters", None) is not True


def nbddp_offload_checkpoint(function, *args, **kwargs):
    """Non-reentrant checkpointing, with the tensors it keeps for the recompute held in CPU memory."""
    from torch.utils.checkpoint import checkpoint

    kwargs["use_reentrant"] = False
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
    with torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda", device_type=device.type):
        return checkpoint(function, *args, **kwargs)


nbddp_offload_checkpoint._nbddp_offload = True


def nbddp_use_non_reentrant(model, offload=True):
    """Swap every layer's checkpointing function for non-reentrant checkpointing (offloaded to CPU if asked)."""
    from torch.utils.checkpoint import checkpoint

    func = nbddp_offload_checkpoint if offload else functools.partial(checkpoint, use_reentrant=False)
    swapped = 0
    base = nbddp_find_module(model, lambda m: not _nbddp_is_wrapper(m)) or model
    for module in base.modules():
        if hasattr(module, "_gradient_checkpointing_func") or getattr(module, "gradient_checkpointing", False):
            module._gradient_checkpointing_func = func
            swapped += 1
    return swapped


def nbddp_decide(model, args=None, all_used=None):
    """Decide and say once: returns (static_graph, find_unused_parameters); swaps checkpointing if needed."""
    mode = nbddp_checkpointing_mode(model, args)
    static, find_unused, swap, why = nbddp_ddp_strategy(mode, _nbddp_all_used(args) if all_used is None else all_used)
    if swap:
        nbddp_use_non_reentrant(model, offload=mode == "unsloth")
    nbddp_say("ddp-strategy", f"DDP static_graph={static}, find_unused_parameters={find_unused} ({why})")
    return static, find_unused


def nbddp_apply_to_ddp(model, static):
    """Set a static graph on the DDP module inside `model` (before its first forward); False if none found."""
    ddp = nbddp_find_module(model, lambda m: type(m).__name__ == "DistributedDataParallel")
    if ddp is None:
        return False
    if static and not getattr(ddp, "static_graph", False):
        ddp._set_static_graph()
    return True


def _nbddp_patch_trainer(module):
    trainer = getattr(module, "Trainer", None)
    if trainer is None or getattr(trainer, "_nbddp_patched", False):
        return
    trainer._nbddp_patched = True
    build = getattr(trainer, "_build_accelerator_args", None)

    if build is not None:
        @functools.wraps(build)
        def _build_accelerator_args(self, *a, **kw):
            out = build(self, *a, **kw)
            handlers = [h for h in out.get("kwargs_handlers", []) if hasattr(h, "static_graph")
                        and hasattr(h, "find_unused_parameters")]
            if NBDDP_WORLD_SIZE > 1 and handlers:
                try:
                    static, find_unused = nbddp_decide(self.model, self.args)
                except Exception as exc:  # the layer must never stop training: keep transformers' choice
                    nbddp_say("ddp-strategy", f"DDP strategy left to transformers ({type(exc).__name__}: {exc})")
                    return out
                for h in handlers:
                    h.static_graph, h.find_unused_parameters = static, find_unused
                self.args.ddp_static_graph, self.args.ddp_find_unused_parameters = static, find_unused
                self._nbddp_ddp_done = True
            return out

        trainer._build_accelerator_args = _build_accelerator_args

    step = trainer.training_step

    @functools.wraps(step)
    def training_step(self, model, *a, **kw):
        if NBDDP_WORLD_SIZE > 1 and not getattr(self, "_nbddp_ddp_done", False):
            self._nbddp_ddp_done = True  # this transformers has no hook before DDP is built: set it now
            try:
                static, _ = nbddp_decide(model, self.args)
                if not nbddp_apply_to_ddp(model, static):
                    nbddp_say("ddp-missing", "no DistributedDataParallel module found at the first training step")
            except Exception as exc:  # the layer must never stop training
                nbddp_say("ddp-strategy", f"DDP strategy left as it is ({type(exc).__name__}: {exc})")
        return step(self, model, *a, **kw)

    trainer.training_step = training_step
    make_loader = getattr(trainer, "get_train_dataloader", None)
    if make_loader is None:
        return

    @functools.wraps(make_loader)
    def get_train_dataloader(self, *a, **kw):  # section 6
        loader = make_loader(self, *a, **kw)
        try:
            return nbddp_balance_loader(loader, self)
        except Exception as exc:  # the layer must never stop training: keep the loader as drawn
            nbddp_say("balance", f"length-balanced ranks off ({type(exc).__name__}: {exc})")
            return loader

    trainer.get_train_dataloader = get_train_dataloader


NBDDP_IMPORTS.watch("transformers.trainer", _nbddp_patch_trainer)


# ---- 2. DDP start-up sync, one tensor at a time ----
def nbddp_sync_module_states(ddp, buffers=True):
    """What DDP's own start-up sync does (shapes checked, then rank 0's parameters and buffers copied to every
    rank), in place and one tensor at a time. DDP's version packs them into 250 MB buckets, and on two H200s that
    held a copy of the largest weight (the 1 GiB embedding of a Llama-3.1-8B shape) at construction: with a small
    trainable part, that copy set the run's memory peak."""
    from torch.distributed import utils as dist_utils

    ignore = getattr(ddp, "parameters_to_ignore", ())
    params = [p for n, p in ddp.module.named_parameters() if n not in ignore]
    check = getattr(dist_utils, "_verify_param_shape_across_processes", None)
    if check is not None:
        check(ddp.process_group, [p for p in params if p.requires_grad])
    states = [p.detach() for p in params]
    if buffers:
        states += [b.detach() for n, b in ddp.module.named_buffers() if n not in ignore]
    src = torch.distributed.get_global_rank(ddp.process_group, 0)
    biggest = 0
    for tensor in states:
        dense = tensor if tensor.is_contiguous() else tensor.contiguous()
        torch.distributed.broadcast(dense, src=src, group=ddp.process_group)
        if dense is not tensor:
            tensor.copy_(dense)
        biggest = max(biggest, tensor.numel() * tensor.element_size())
    return biggest


def _nbddp_patch_ddp(module):
    cls = module.DistributedDataParallel
    init = cls.__init__
    if getattr(cls, "_nbddp_patched", False):
        return
    if "init_sync" not in inspect.signature(init).parameters:  # older torch, or a wrapper hiding the signature
        if NBDDP_WORLD_SIZE > 1:
            nbddp_say("lean-init-sync", "DDP start-up sync left to DDP (its constructor shows no init_sync)")
        return
    cls._nbddp_patched = True

    @functools.wraps(init)
    def __init__(self, mod, *a, **kw):
        ours = (not a and "init_sync" not in kw and kw.get("mixed_precision") is None
                and _nbddp_choice("NBDDP_LEAN_INIT_SYNC") is not False
                and all(t.layout == torch.strided for t in itertools.chain(mod.parameters(), mod.buffers())))
        if not ours:
            return init(self, mod, *a, **kw)
        init(self, mod, init_sync=False, **kw)
        buffers = kw.get("forward_sync_buffers") is not None or kw.get("broadcast_buffers") is not False
        biggest = nbddp_sync_module_states(self, buffers)
        nbddp_say("lean-init-sync", f"DDP start-up sync one tensor at a time (no packed copy; the largest tensor "
                                    f"is {biggest / 2**30:.2f} GiB)")

    cls.__init__ = __init__


NBDDP_IMPORTS.watch("torch.nn.parallel.distributed", _nbddp_patch_ddp)


# ---- 3. TiledMLP: chunked MLP backward that gives DDP each parameter's gradient once ----
def nbddp_chunked_grads(forward, x_chunks, grad_chunks, params):
    """Gradients of `forward` over sequence chunks, all computed functionally (torch.autograd.grad: no
    parameter hooks run, so DDP's hooks do not fire once per chunk). Returns (input grad chunks, param grads)."""
    x_grads, totals = [], [None] * len(params)
    for x_chunk, g_chunk in zip(x_chunks, grad_chunks):
        x_chunk = x_chunk.detach().requires_grad_(True)
        with torch.enable_grad():
            out = forward(x_chunk)
        out = out[0] if isinstance(out, tuple) else out
        grads = torch.autograd.grad(out, [x_chunk] + list(params), g_chunk, allow_unused=True)
        x_grads.append(grads[0] if grads[0] is not None else torch.zeros_like(x_chunk))
        for i, g in enumerate(grads[1:]):
            if g is not None:
                totals[i] = g if totals[i] is None else totals[i].add_(g)
    return x_grads, totals


class NbddpTiledMLP(torch.autograd.Function):
    """y = forward(x) computed token chunk by token chunk, in forward and in backward (DDP-safe). The trainable
    parameters are inputs of the node: their summed gradient leaves backward through the node, so each
    parameter's hooks (DDP's) fire once, and DDP's search for unused parameters sees them as used."""

    @staticmethod
    def forward(ctx, forward, x, chunks, *params):
        ctx.forward, ctx.chunks, ctx.params = forward, chunks, params
        ctx.save_for_backward(x)
        flat = x.reshape(-1, x.shape[-1])
        with torch.no_grad():
            outs = [forward(c.unsqueeze(0)) for c in flat.tensor_split(chunks, dim=0)]
        outs = [o[0] if isinstance(o, tuple) else o for o in outs]
        return torch.cat([o.reshape(-1, o.shape[-1]) for o in outs]).view(*x.shape[:-1], -1)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        hidden = x.shape[-1]
        x_chunks = [c.unsqueeze(0) for c in x.reshape(-1, hidden).tensor_split(ctx.chunks, dim=0)]
        g_chunks = [c.unsqueeze(0) for c in grad.reshape(-1, grad.shape[-1]).tensor_split(ctx.chunks, dim=0)]
        grads, param_grads = nbddp_chunked_grads(ctx.forward, x_chunks, g_chunks, ctx.params)
        x_grad = torch.cat([g.reshape(-1, hidden) for g in grads]).view_as(x)
        return (None, x_grad, None, *param_grads)


def nbddp_tiled_mlp(forward, x, chunks, params=None):
    """Run `forward` (an MLP) on `x` in `chunks` token chunks, forward and backward, DDP-safe."""
    if params is None:
        params = forward.parameters()
    return NbddpTiledMLP.apply(forward, x, chunks, *[p for p in params if p.requires_grad])


def _nbddp_patch_tiled_mlp(module):
    """unsloth_zoo's TiledMLP runs one backward per chunk, so DDP's hooks fire once per chunk ("marked ready
    twice"). Under torch.distributed its apply() goes through NbddpTiledMLP instead; one process: unchanged."""
    tiled = getattr(module, "TiledMLP", None)
    try:
        wanted = ["ctx", "mlp_forward", "mlp_module", "x", "preserve_rng_state", "num_shards"]
        api_ok = tiled is not None and list(inspect.signature(tiled.forward).parameters)[:6] == wanted
    except (TypeError, ValueError):
        api_ok = False
    if not api_ok:
        nbddp_say("tiled-mlp", "unsloth_zoo TiledMLP has an API nbddp does not know; it is left as is")
        return
    original = tiled.apply

    def apply(mlp_forward, mlp_module, x, preserve_rng_state, num_shards, *rest):
        if preserve_rng_state or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return original(mlp_forward, mlp_module, x, preserve_rng_state, num_shards, *rest)
        return nbddp_tiled_mlp(mlp_forward, x, max(1, int(num_shards)), mlp_module.parameters())

    tiled.apply = staticmethod(apply)
    nbddp_say("tiled-mlp", "unsloth_zoo TiledMLP made DDP-safe (gradient hooks fire once per step)")


NBDDP_IMPORTS.watch("unsloth_zoo.tiled_mlp", _nbddp_patch_tiled_mlp)


# ---- 4. Shims ----
def _nbddp_patch_peft(module):
    """LoraConfig(ensure_weight_tying=...) on a peft that lacks the field: accepted and ignored."""
    config = getattr(module, "LoraConfig", None)
    if config is None or "ensure_weight_tying" in getattr(config, "__dataclass_fields__", {}) \
            or "ensure_weight_tying" in inspect.signature(config.__init__).parameters:
        return
    init = config.__init__

    @functools.wraps(init)
    def __init__(self, *a, **kw):
        if "ensure_weight_tying" in kw:
            kw.pop("ensure_weight_tying")
            nbddp_say("lora-tying", "LoraConfig: ensure_weight_tying ignored (this peft does not have it)")
        init(self, *a, **kw)

    config.__init__ = __init__


NBDDP_IMPORTS.watch("peft", _nbddp_patch_peft)


def _nbddp_patch_xformers(module):
    """xformers attention with a tensor bias on another device than the query: the bias follows the query."""
    attention = getattr(module, "memory_efficient_attention", None)
    if attention is None or getattr(attention, "_nbddp", False):
        return

    @functools.wraps(attention)
    def memory_efficient_attention(query, key, value, attn_bias=None, *a, **kw):
        if isinstance(attn_bias, torch.Tensor) and attn_bias.device != query.device:
            attn_bias = attn_bias.to(query.device)
        return attention(query, key, value, attn_bias, *a, **kw)

    memory_efficient_attention._nbddp = True
    module.memory_efficient_attention = memory_efficient_attention


NBDDP_IMPORTS.watch("xformers.ops", _nbddp_patch_xformers)


# ---- 5. Keep the global batch: gradient accumulation divided by the number of processes ----
class NbddpAccumulation(int):
    """A gradient_accumulation_steps value nbddp already divided by the world size."""


def nbddp_accumulation(steps, batch=None):
    """`steps` / world size when it divides evenly (same global batch as one process), else `steps` and a warning."""
    if isinstance(steps, NbddpAccumulation) or NBDDP_WORLD_SIZE == 1 or not isinstance(steps, int):
        return steps
    if steps % NBDDP_WORLD_SIZE == 0:
        nbddp_say("global-batch", f"gradient_accumulation_steps {steps} -> {steps // NBDDP_WORLD_SIZE} "
                                  f"({NBDDP_WORLD_SIZE} processes keep the one-process global batch)")
        return NbddpAccumulation(steps // NBDDP_WORLD_SIZE)
    per_device = f"{batch} x " if batch is not None else "per_device_train_batch_size x "
    nbddp_say("global-batch", f"warning: gradient_accumulation_steps={steps} does not divide by {NBDDP_WORLD_SIZE} "
                              f"processes; effective global batch is {per_device}{steps} x {NBDDP_WORLD_SIZE}")
    return NbddpAccumulation(steps)


def _nbddp_patch_training_args(module):
    args_class = getattr(module, "TrainingArguments", None)
    if args_class is None or not _nbddp_flag("NBDDP_KEEP_GLOBAL_BATCH"):
        return
    post_init = args_class.__post_init__

    @functools.wraps(post_init)
    def __post_init__(self, *a, **kw):
        self.gradient_accumulation_steps = nbddp_accumulation(self.gradient_accumulation_steps,
                                                              getattr(self, "per_device_train_batch_size", None))
        return post_init(self, *a, **kw)

    args_class.__post_init__ = __post_init__


NBDDP_IMPORTS.watch("transformers.training_args", _nbddp_patch_training_args)
# ---- 6. Equal work per rank: each optimizer step's samples dealt out by length ----
def nbddp_balance_window(batches, length, world):
    """The batches of one optimizer step on every rank (batch i goes to rank i % world), with the same samples
    re-dealt: sorted by length into micro-batches of similar samples, the longest first, each to the rank with the
    fewest padded tokens so far. Ranks then wait less on each other at the all-reduce, and pad less."""
    size = len(batches[0])
    if any(len(b) != size for b in batches) or len(batches) % world:
        return batches
    lengths = {i: length(i) for b in batches for i in b}
    ordered = sorted(lengths, key=lengths.get, reverse=True)
    slots = len(batches) // world
    ranks, load = [[] for _ in range(world)], [0] * world
    for start in range(0, len(ordered), size):
        micro = ordered[start:start + size]
        rank = min((r for r in range(world) if len(ranks[r]) < slots), key=load.__getitem__)
        ranks[rank].append(micro)
        load[rank] += len(micro) * lengths[micro[0]]
    return [ranks[r][slot] for slot in range(slots) for r in range(world)]


class NbddpBalancedBatches:
    """Stands in for the batch sampler that accelerate shards over the ranks; every rank draws the same batches
    from it (accelerate seeds them alike), so every rank deals each window the same way."""

    def __init__(self, inner, length, world, accumulation):
        self.inner, self.length, self.window = inner, length, world * accumulation
        self.world = world

    def __getattr__(self, name):  # batch_size, drop_last, sampler, set_epoch: the wrapped sampler's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __len__(self):
        return len(self.inner)

    def __iter__(self):
        window = []
        for batch in self.inner:
            window.append(batch)
            if len(window) == self.window:
                yield from nbddp_balance_window(window, self.length, self.world)
                window = []
        yield from window  # the epoch's last, partial step: as drawn


def _nbddp_length_of(dataset, trainer):
    """Sample index -> token count, from the dataset's length or input column; None if it has neither."""
    columns = getattr(dataset, "column_names", None) or []
    names = [getattr(trainer.args, "length_column_name", "length")]
    names += list(getattr(getattr(trainer, "processing_class", None), "model_input_names", None) or [])[:1]
    name = next((n for n in names + ["input_ids"] if n in columns), None)
    if name is None:
        return None
    column = dataset.select_columns([name])
    if name == names[0]:
        return lambda i: int(column[i][name])
    return lambda i: len(column[i][name])


def nbddp_balance_loader(loader, trainer):
    """Wrap the train loader's batches in NbddpBalancedBatches where that cannot change the gradient: the loss is
    normalised by the token count of the whole step on every rank (transformers' average_tokens_across_devices), so
    which rank and micro-batch a sample lands in changes only the floating-point order. On by default;
    NBDDP_BALANCE_LENGTHS=0 turns it off, =force skips the check."""
    force = os.environ.get("NBDDP_BALANCE_LENGTHS", "").strip().lower() == "force"
    shard = getattr(loader, "batch_sampler", None)
    if _nbddp_choice("NBDDP_BALANCE_LENGTHS") is False or NBDDP_WORLD_SIZE == 1 \
            or isinstance(getattr(shard, "batch_sampler", None), NbddpBalancedBatches):
        return loader
    args = trainer.args
    why = None
    if str(getattr(args, "train_sampling_strategy", "random")) not in ("random", "sequential") \
            or getattr(args, "group_by_length", False):
        why = "the notebook chose a length-aware sampling order of its own"
    elif type(shard).__name__ != "BatchSamplerShard" or getattr(shard, "split_batches", True) \
            or getattr(shard, "num_processes", 1) != NBDDP_WORLD_SIZE:
        why = "the train loader is not one that accelerate deals out batch by batch"
    elif not force and not (getattr(args, "average_tokens_across_devices", False)
                                 and (getattr(trainer, "model_accepts_loss_kwargs", False)
                                      or getattr(trainer, "compute_loss_func", None))):
        why = ("the loss is not normalised by the whole step's token count, so moving samples between ranks "
               "would change the gradient (NBDDP_BALANCE_LENGTHS=force forces it)")
    length = None if why else _nbddp_length_of(getattr(loader, "dataset", None), trainer)
    if why is None and length is None:
        why = "the dataset has no token-length column to balance by"
    if why:
        nbddp_say("balance", f"length-balanced ranks off: {why}")
        return loader
    accumulation = int(args.gradient_accumulation_steps)
    shard.batch_sampler = NbddpBalancedBatches(shard.batch_sampler, length, NBDDP_WORLD_SIZE, accumulation)
    nbddp_say("balance", f"length-balanced ranks: each optimizer step's {NBDDP_WORLD_SIZE} x {accumulation} "
                         f"micro-batches keep their samples, dealt out by length (NBDDP_BALANCE_LENGTHS=0: off)")
    return loader


# ---- end of nbddp DDP compatibility layer ----


