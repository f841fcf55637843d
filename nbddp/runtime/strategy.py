"""DDP's graph settings (static_graph, find_unused_parameters) chosen from the model's gradient-checkpointing
mode, at the point where the Trainer builds DDP. Reentrant checkpointing re-runs the forward inside backward: DDP
then sees parameters either as unused (find_unused_parameters=True marks them ready at the end of forward, and
again in backward) or as used twice. With every trainable parameter used, find_unused_parameters=False cures it;
where some may be unused, reentrant checkpointing is swapped for non-reentrant checkpointing, which DDP follows."""
import functools
import inspect

from .checkpoint import nbddp_base_model, nbddp_find_module, nbddp_use_non_reentrant
from .group import NBDDP_WORLD_SIZE
from .hooks import NBDDP_IMPORTS, _nbddp_choice, _nbddp_flag, nbddp_say


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
    for module in nbddp_base_model(model).modules():
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
    return next((mode for mode in ("unsloth", "reentrant", "non-reentrant") if mode in found), "none")


def nbddp_ddp_strategy(mode, all_used=True):
    """(static_graph, find_unused_parameters, swap to non-reentrant, reason) for a checkpointing mode."""
    swap = mode in ("reentrant", "unsloth") and not all_used
    why = "no gradient checkpointing" if mode == "none" else f"{mode} gradient checkpointing"
    if swap:
        why += " with parameters unused in some steps: switched to non-reentrant checkpointing"
    elif mode in ("reentrant", "unsloth"):
        # No static graph: with Unsloth 2026.10's checkpointing it failed at the first backward on 2 GPUs (reducer
        # INTERNAL ASSERT expect_autograd_hooks_), and it brings nothing when every parameter is used.
        why += ", every trainable parameter used"
    elif not all_used:
        why += ", some trainable parameters unused in some steps"
    static, find_unused = False, not all_used
    forced, alias = _nbddp_choice("NBDDP_STATIC_GRAPH"), "NBDDP_STATIC_GRAPH"
    if forced is None and _nbddp_flag("UNSLOTH_DISABLE_DDP_STATIC_GRAPH"):
        forced, alias = False, "UNSLOTH_DISABLE_DDP_STATIC_GRAPH"
    elif forced is None and mode != "none" and _nbddp_flag("UNSLOTH_DISABLE_DDP_STATIC_GRAPH_FOR_GRAD_CHECKPOINT"):
        forced, alias = False, "UNSLOTH_DISABLE_DDP_STATIC_GRAPH_FOR_GRAD_CHECKPOINT"
    if forced is not None:
        static, why = forced, f"{why}; static_graph set by {alias}"
    forced = _nbddp_choice("NBDDP_FIND_UNUSED")
    if forced is not None:
        find_unused, why = forced, f"{why}; find_unused_parameters set by NBDDP_FIND_UNUSED"
    return static, find_unused, swap, why


def nbddp_decide(model, args=None, all_used=None):
    """Decide and say once: returns (static_graph, find_unused_parameters); swaps checkpointing if needed.
    Every trainable parameter counts as used each step (LoRA adapters are) unless NBDDP_FIND_UNUSED=1 or the
    notebook's ddp_find_unused_parameters=True says otherwise."""
    if all_used is None:
        forced = _nbddp_choice("NBDDP_FIND_UNUSED")
        all_used = not forced if forced is not None else getattr(args, "ddp_find_unused_parameters", None) is not True
    mode = nbddp_checkpointing_mode(model, args)
    static, find_unused, swap, why = nbddp_ddp_strategy(mode, all_used)
    if swap:
        nbddp_use_non_reentrant(model, offload=mode == "unsloth")
    nbddp_say("ddp-strategy", f"DDP static_graph={static}, find_unused_parameters={find_unused} ({why})")
    return static, find_unused


def nbddp_apply_to_ddp(model, static):
    """Set a static graph on the DDP module inside `model` (before its first forward); False if none found."""
    ddp = nbddp_find_module(model, lambda m: type(m).__name__ == "DistributedDataParallel")
    if ddp is not None and static and not getattr(ddp, "static_graph", False):
        ddp._set_static_graph()
    return ddp is not None


def _nbddp_settings(trainer, model):
    """nbddp_decide for a Trainer; None where it failed (the layer must never stop training)."""
    trainer._nbddp_ddp_done = True
    try:
        return nbddp_decide(model, trainer.args)
    except Exception as exc:
        nbddp_say("ddp-strategy", f"DDP strategy left to transformers ({type(exc).__name__}: {exc})")
        return None


def _nbddp_patch_trainer_ddp(module):
    """Trainer: the settings go where transformers 5 builds accelerate's DDP kwargs, or, in transformers 4, onto
    the DDP module at the first training step (before its first forward)."""
    trainer = getattr(module, "Trainer", None)
    if trainer is None or getattr(trainer, "_nbddp_ddp_patched", False):
        return
    trainer._nbddp_ddp_patched = True
    build, step = getattr(trainer, "_build_accelerator_args", None), trainer.training_step

    def _build_accelerator_args(self, *a, **kw):
        out = build(self, *a, **kw)
        handlers = [h for h in out.get("kwargs_handlers", []) if hasattr(h, "static_graph")
                    and hasattr(h, "find_unused_parameters")]
        settings = NBDDP_WORLD_SIZE > 1 and handlers and _nbddp_settings(self, self.model)
        if settings:
            for h in handlers:
                h.static_graph, h.find_unused_parameters = settings
            self.args.ddp_static_graph, self.args.ddp_find_unused_parameters = settings
        return out

    def training_step(self, model, *a, **kw):
        if NBDDP_WORLD_SIZE > 1 and not getattr(self, "_nbddp_ddp_done", False):
            settings = _nbddp_settings(self, model)
            if settings and not nbddp_apply_to_ddp(model, settings[0]):
                nbddp_say("ddp-missing", "no DistributedDataParallel module found at the first training step")
        return step(self, model, *a, **kw)

    if build is not None:
        trainer._build_accelerator_args = functools.wraps(build)(_build_accelerator_args)
    trainer.training_step = functools.wraps(step)(training_step)


NBDDP_IMPORTS.watch("transformers.trainer", _nbddp_patch_trainer_ddp)
