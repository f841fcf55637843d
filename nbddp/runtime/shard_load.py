"""Loading a model straight into the sharded mode (docs/sharded.md, "Loading each rank's share"): from a folder saved
by `save_pretrained` (safetensors: `model.safetensors`, or an index of several files), without a rank ever holding
more than one whole decoder layer of it.

The model is made on the meta device from its config (and, by `prepare`, given its adapters there: peft wraps a
meta model); the modules outside the decoder layers (embeddings, head, final norm) are filled whole from the
checkpoint; then each decoder layer is filled from the checkpoint's tensors of that layer alone (safetensors reads
one tensor at a time) in the `build(index, block)` step of `nbddp_shard_model`, just before the layer is sharded.
A tensor the checkpoint does not hold (a new adapter's) is made on the device and initialized as its module does
(`reset_parameters`, and peft's `reset_lora_parameters`: A as nn.Linear's default, B zero); a non-persistent buffer
(the rotary embedding's frequencies) is computed again by a fresh module of its class. Every tensor from the
checkpoint is frozen (the base of LoRA/QLoRA): the layers' ones are what the sharded mode shards.

fp32, fp16 and bf16 checkpoints, kept in their dtype or cast (`dtype`); bitsandbytes 4-bit, quantized on load or
pre-quantized, through the `skeleton` and `make` steps that shard_quant.py gives.

A converted script carries it where the notebook can train sharded: shard_mode.py sends the notebook's own
`from_pretrained` here in the sharded mode."""
import json
import os

import torch

from .shard import nbddp_blocks, nbddp_shard_model


class NbddpCheckpoint:
    """The tensors of a folder saved by `save_pretrained` with safetensors, read one at a time (`get`); `reads`: the
    keys read, in order."""

    def __init__(self, folder):
        self.folder, self.files, self.reads = folder, {}, []
        index = os.path.join(folder, "model.safetensors.index.json")
        if os.path.exists(index):
            with open(index, encoding="utf-8") as fh:
                self.where = dict(json.load(fh)["weight_map"])
        elif os.path.exists(os.path.join(folder, "model.safetensors")):
            self.where = {key: "model.safetensors" for key in self._open("model.safetensors").keys()}
        else:
            raise FileNotFoundError(f"{folder}: neither model.safetensors nor model.safetensors.index.json (the "
                                    "sharded load reads safetensors checkpoints only)")

    def _open(self, name):
        from safetensors import safe_open
        if name not in self.files:
            self.files[name] = safe_open(os.path.join(self.folder, name), framework="pt")
        return self.files[name]

    def __contains__(self, key):
        return key in self.where

    def keys(self):
        return list(self.where)

    def get(self, key):
        self.reads.append(key)
        return self._open(self.where[key]).get_tensor(key)


class NbddpLoader:
    """Fills a meta model's tensors from a checkpoint, module by module (`fill`). `prefixes`: each module of the
    unprepared model (by id) to its name in the checkpoint, so that a module peft wrapped keeps its keys."""

    def __init__(self, checkpoint, config, prefixes, device, dtype, key_of, make=None, model_cls=None):
        self.checkpoint, self.config, self.prefixes, self.make = checkpoint, config, prefixes, make
        self.model_cls, self.reference = model_cls, None
        self.device, self.dtype, self.key_of = torch.device(device), dtype, key_of or (lambda key: key)
        self.memo = {}  # id of a meta tensor -> what replaced it (a tensor held by two modules: tied weights)
        self.missing = []

    def fill(self, modules):
        """The meta tensors of these (name, module) pairs, each module's own, made on the device: from the
        checkpoint, else new; then a module whose tensors are all new is initialized as it initializes itself, and
        a peft LoRA layer with a new adapter as peft does."""
        fresh = {}
        for name, module in modules:
            made = [self._make(module, name, kind, key, tensor) for kind in ("_parameters", "_buffers")
                    for key, tensor in list(getattr(module, kind).items()) if tensor is not None and tensor.is_meta]
            if made and all(made):
                fresh[id(module)] = module
        with torch.no_grad():
            for module in fresh.values():
                if hasattr(module, "reset_parameters"):
                    module.reset_parameters()
            for _, module in modules:  # peft's default (init_lora_weights=True): A as nn.Linear's, B zero
                if hasattr(module, "reset_lora_parameters") and any(id(m) in fresh for m in module.modules()):
                    for adapter in getattr(module, "lora_A", {}):
                        module.reset_lora_parameters(adapter, True)

    def _make(self, module, module_name, kind, key, meta):
        """One meta tensor replaced; True where it is new (not in the checkpoint, not a recomputed buffer)."""
        holder = getattr(module, kind)
        if id(meta) in self.memo:
            holder[key] = self.memo[id(meta)]
            return False
        prefix = self.prefixes.get(id(module))
        stored = self.key_of(f"{prefix}.{key}" if prefix else key) if prefix is not None else None
        new, value = False, self.make and self.make(self.checkpoint, module, meta, stored)
        if value is not None:  # made as it is (a 4-bit weight: shard_quant.py)
            holder[key] = self.memo[id(meta)] = value
            return False
        if stored is not None and stored in self.checkpoint:
            value = self.checkpoint.get(stored)
            value = value.to(self.device, self.dtype if self.dtype is not None and value.is_floating_point() else None)
            if tuple(value.shape) != tuple(meta.shape):
                raise ValueError(f"{stored}: {tuple(value.shape)} in the checkpoint, {tuple(meta.shape)} in the model")
        elif kind == "_buffers" and key in module._non_persistent_buffers_set:
            value = self._recompute(module, module_name, key)
        else:
            value, new = torch.empty_like(meta, device=self.device), True
            self.missing.append(f"{module_name}.{key}" if module_name else key)
        if kind == "_parameters":
            value = torch.nn.Parameter(value, requires_grad=meta.requires_grad and new)
        holder[key] = self.memo[id(meta)] = value
        return new

    def _recompute(self, module, module_name, key):
        """A non-persistent buffer (not saved: the rotary embedding's frequencies, an embedding's scale) as the
        model makes it: from the model made once more, its parameters on the meta device and its buffers real."""
        if self.reference is None:
            from accelerate import init_empty_weights
            with init_empty_weights(include_buffers=False):
                self.reference = self.model_cls(self.config)
        prefix = self.prefixes.get(id(module))
        try:
            return self.reference.get_submodule(prefix or "").get_buffer(key).to(self.device)
        except AttributeError as error:
            raise ValueError(f"{module_name}.{key}: a buffer the checkpoint does not hold, and the model made from "
                             f"its config has none there: {error}") from error


def _nbddp_model_class(config, model_cls):
    import transformers
    if model_cls is not None:
        return model_cls
    for name in getattr(config, "architectures", None) or []:
        if hasattr(transformers, name):
            return getattr(transformers, name)
    return transformers.AutoModelForCausalLM.from_config


def nbddp_load_sharded(folder, device="cpu", dtype=None, prepare=None, key_of=None, model_cls=None, group=None,
                       config=None, skeleton=None, make=None, **shard_kwargs):
    """The model saved in `folder` (`save_pretrained`, safetensors) on this rank, its decoder layers sharded over the
    process group as `nbddp_shard_model` shards them (`shard_kwargs`: prefetch, timing, transport), never more than
    one whole layer of it read on a rank. `device`: where this rank's tensors go; `dtype`: the floating tensors cast
    to it (None: as saved); `prepare(model)`: applied to the meta model before anything is read (e.g. peft's
    `get_peft_model`), returns the model to fill; `key_of(name)`: a tensor's name in the model (as the unprepared
    model names it) to its key in the checkpoint; `skeleton(model)`: applied to the meta model first, its modules
    then named as the checkpoint names them (4-bit: Linear layers made Linear4bit); `make(checkpoint, module, meta,
    stored)`: a tensor made otherwise than read and cast, or None (4-bit weights: shard_quant.py). Returns (model,
    shards): `shards.ignored` are the names DDP must leave alone (already given to `nbddp_ddp_ignore` for the
    returned model), `shards.loaded` the checkpoint keys read, outside the layers and then layer by layer,
    `shards.new` the tensors made new (not in the checkpoint)."""
    import transformers
    config = config if config is not None else transformers.AutoConfig.from_pretrained(folder)
    checkpoint = NbddpCheckpoint(folder)
    model_cls = _nbddp_model_class(config, model_cls)
    with torch.device("meta"):
        model = model_cls(config)
    if skeleton is not None:
        model = skeleton(model)
    prefixes = {id(m): n for n, m in model.named_modules()}
    for _, param in model.named_parameters():
        param.requires_grad_(False)  # the base is frozen; what `prepare` adds trains
    if prepare is not None:
        model = prepare(model)
    loader = NbddpLoader(checkpoint, config, prefixes, device, dtype, key_of, make, model_cls)
    blocks = nbddp_blocks(model)
    inside = {id(m) for block in blocks for m in block.modules()}
    loader.fill([(n, m) for n, m in model.named_modules() if id(m) not in inside])  # outside: whole on each rank
    loaded = {"outside": list(checkpoint.reads), "blocks": []}
    names = {id(b): n for n, b in model.named_modules() if id(b) in {id(x) for x in blocks}}

    def build(index, block):
        start = len(checkpoint.reads)
        loader.fill(list(block.named_modules(prefix=names[id(block)])))
        loaded["blocks"].append(checkpoint.reads[start:])

    shards = nbddp_shard_model(model, build=build, group=group, **shard_kwargs)
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise ValueError(f"still on the meta device after the load: {left[:5]}")
    shards.loaded, shards.new = loaded, loader.missing
    return model, shards

