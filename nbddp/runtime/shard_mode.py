"""The sharded mode in a converted script (docs/sharded.md), where the fit check chooses it or NBDDP_MODE=shard asks
for it: the notebook's own `from_pretrained` of a causal LM loads the model layer by layer into the mode
(shard_load.py), so that no rank ever holds the whole model, and every DDP wrap made later (the Trainer's, of the
model peft's `get_peft_model` made around it) leaves the sharded parameters out, under whatever names its wrappers
give them. The fit check (fit.py) gets from here, through NBDDP_SHARDABLE, the mode's share of a model on each
process (None where this mode cannot load it) and its start (the line, the stops, the patches).

What loads sharded: transformers' `PreTrainedModel.from_pretrained` of a causal LM (a class AutoModelForCausalLM maps a
model type to, or a subclass of one), reached through AutoModelForCausalLM or the class itself (patched when the
notebook first imports transformers' modeling, in this mode only), from a local `save_pretrained` folder with
safetensors or a hub id whose safetensors are in the Hugging Face cache (downloaded there first where they are not:
the first rank of each machine downloads, the others wait), in fp32, fp16 or bf16 (`dtype`: "auto", the
default, is the config's dtype, else as saved), or in bitsandbytes 4-bit (shard_quant.py): quantized on load
(`load_in_4bit=True`, a 4-bit BitsAndBytesConfig) or pre-quantized (the checkpoint's config says so). Unsloth's loaders
reach it: they call AutoModelForCausalLM's. Any other quantization (8-bit included) stops with one line,
NBDDP_MODE=split instead. Another model class loads whole on every rank, said once. The gathers copy from shared host
memory where every rank is on one machine whose free memory holds one copy of the frozen layers with room to spare (a
forward pass of rank 0 alone, such as generation after training, needs no other rank), else they are all-gathers, and
the load's line says why."""
import functools
import os

import torch

from .fit import (NBDDP_ALLOWANCE, NBDDP_GIB, NBDDP_SHARDABLE, _nbddp_config, _nbddp_stop, nbddp_shard_gib,
                  nbddp_weight_gib)
from .group import NBDDP_DEVICE, NBDDP_IS_LOCAL_MAIN, NBDDP_WORLD_SIZE, nbddp_barrier, nbddp_dist
from .hooks import NBDDP_IMPORTS, _nbddp_flag, nbddp_say
from .launcher import NBDDP_LAUNCHED, nbddp_nproc
from .shard_host import nbddp_host_available, nbddp_host_transport
from .shard_load import nbddp_load_sharded
from .shard_quant import (nbddp_quant_finish, nbddp_quant_maker, nbddp_quant_said, nbddp_quant_skeleton,
                          nbddp_quantizer)
from .split_place import nbddp_wrap_from_pretrained

NBDDP_SHARDED = []  # the NbddpShards of each model loaded sharded
# from_pretrained's keywords that choose where or how to fetch, or place the model: the sharded load has its own way
_NBDDP_NOT_NEEDED = frozenset({
    "cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "use_safetensors",
    "weights_only", "device_map", "max_memory", "offload_folder", "offload_state_dict", "offload_buffers",
    "low_cpu_mem_usage", "trust_remote_code", "ignore_mismatched_sizes", "disable_mmap", "_fast_init",
    "_from_auto", "_from_pipeline", "_commit_hash"})  # the last three: what transformers' Auto classes pass on
_NBDDP_QUANTIZE = ("quantization_config", "load_in_4bit", "load_in_8bit")


def nbddp_weights_folder(model, revision=None, cache_dir=None):
    """The folder of a model's safetensors on this machine: `model` itself (a folder), or its snapshot in the Hugging
    Face cache where that holds them (no download); None where neither does."""
    if os.path.isdir(model):
        return model
    try:
        from huggingface_hub import try_to_load_from_cache
        for name in ("model.safetensors.index.json", "model.safetensors"):
            path = try_to_load_from_cache(model, name, cache_dir=cache_dir, revision=revision)
            if isinstance(path, str):
                return os.path.dirname(path)
    except Exception:  # not a hub id, or no huggingface_hub: not here
        pass
    return None


def nbddp_downloadable(model):
    """A hub id this machine may download: not a local path, and the hub not switched off (HF_HUB_OFFLINE)."""
    return not _nbddp_flag("HF_HUB_OFFLINE") and not os.path.exists(model) and not model.startswith((".", "/", "~"))


def nbddp_download(model, revision=None, cache_dir=None, token=None):
    """The model's safetensors and JSON files in the Hugging Face cache: the first rank of each machine downloads
    them, the others wait (however long it takes) and find them there; the snapshot's folder."""
    from huggingface_hub import snapshot_download

    def fetch():
        return snapshot_download(model, revision=revision, cache_dir=cache_dir, token=token,
                                 allow_patterns=["*.safetensors", "*.json"])
    if not NBDDP_IS_LOCAL_MAIN:
        nbddp_barrier("download")
        return fetch()
    folder = fetch()
    nbddp_barrier("download")
    return folder


def nbddp_shard_share(models, n):
    """The fit check's GiB on each of `n` processes with the notebook's models sharded (the largest counts), or None
    where this mode cannot load them: one process, an 8-bit load, files neither on this machine nor to download (the
    hub switched off). 4-bit: the layers' packed bytes, their quantization constants and the 16-bit embeddings and
    head."""
    if n < 2 or any(bits not in (4, 16, 32) or nbddp_weights_folder(model) is None and not nbddp_downloadable(model)
                    for model, bits in models):
        return None
    return max(nbddp_shard_gib(_nbddp_config(model), bits, n) for model, bits in models)


def nbddp_shard_start(models, numbers=None, shard=None):
    """The sharded mode, chosen by the fit check (its `numbers`, and `shard`: GiB a process) or asked for by
    NBDDP_MODE=shard: stopped where it cannot run, said in one line once a job (the process that starts the ranks
    says it, they do not again: NBDDP_FIT_SAID, its process id, in their environment), turned on."""
    launched = any(name in os.environ for name in NBDDP_LAUNCHED)
    n = NBDDP_WORLD_SIZE if launched else nbddp_nproc()
    if n < 2:
        _nbddp_stop(f"NBDDP_MODE=shard shards the layers over 2 processes or more, this job has {n}: NBDDP_NPROC=2 "
                    "(or torchrun --nproc_per_node=2), or NBDDP_MODE=split")
    asked = numbers is None
    if asked:  # the model's own numbers, where its config can be read
        numbers = "NBDDP_MODE=shard"
        try:
            weights = max(nbddp_weight_gib(_nbddp_config(model), bits) for model, bits in models)
            shard = nbddp_shard_share(models, n)
            numbers += f": the model needs ~{weights * NBDDP_ALLOWANCE[0] + NBDDP_ALLOWANCE[1]:.1f} GiB in one " \
                       "process" if shard else ""
        except Exception:  # no config to read: the mode as asked, without numbers
            shard = None
    said = numbers + (f", ~{shard:.1f} GiB a process with its layers sharded over {n}" if shard else "")
    if not (launched and os.environ.get("NBDDP_FIT_SAID") == str(os.getppid())):
        nbddp_say("fit", f"{said}: {n} processes, each holding 1/{n} of the frozen layers (each layer gathered whole "
                         "as it runs), the adapters data-parallel" + (
                             "" if asked else " (NBDDP_MODE=split: one process, the model split over the GPUs)"))
    if not launched:
        os.environ["NBDDP_FIT_SAID"] = str(os.getpid())
    nbddp_shard_mode_on()
    return "shard"


def nbddp_shard_dtype(dtype, config):
    """The dtype a load asks for, as from_pretrained reads it: None or "auto" is the config's (None: as saved)."""
    if dtype is None or dtype == "auto":
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


def nbddp_shard_sizes(model, shards):
    """(bytes of the layers' frozen weights, this rank's share of them, bytes held whole outside them)."""
    whole = sum(p.numel() * p.element_size() for p in model.parameters() if p.numel())
    return sum(b.size for b in shards.blocks), sum(b.shard.numel() for b in shards.blocks), whole


def _nbddp_bytes(n):
    return next(f"{n / 2 ** bits:.1f} {unit}" for bits, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB"), (0, "B"))
                if n >= 2 ** bits or not bits)


def nbddp_from_pretrained_sharded(cls, name, config=None, **kwargs):
    """`cls.from_pretrained(name, ...)` in the sharded mode: the model on this rank's device, its decoder layers
    sharded over the process group."""
    import transformers
    shown = f"{cls.__name__}.from_pretrained({os.fspath(name)!r})"
    folder = nbddp_weights_folder(os.fspath(name), kwargs.get("revision"), kwargs.get("cache_dir"))
    if folder is None and nbddp_downloadable(os.fspath(name)) and not kwargs.get("local_files_only"):
        nbddp_dist()
        folder = nbddp_download(os.fspath(name), kwargs.get("revision"), kwargs.get("cache_dir"), kwargs.get("token"))
    if folder is None:
        _nbddp_stop(f"{shown}: the sharded mode loads a local folder, or a model whose files are in the Hugging Face "
                    f"cache or can be downloaded (HF_HUB_OFFLINE is set): download it first (`hf download {name}`), or "
                    "NBDDP_MODE=split")
    folder = os.path.join(folder, kwargs["subfolder"]) if kwargs.get("subfolder") else folder
    if not isinstance(config, transformers.PretrainedConfig):
        config = transformers.AutoConfig.from_pretrained(config or folder)
    if (kwargs.pop("adapter_kwargs", None) or {}).get("_adapter_model_path"):
        _nbddp_stop(f"{shown}: a peft adapter's folder, loaded with its base model: not built in the sharded mode "
                    "yet (load the base model, then the adapter with peft); NBDDP_MODE=split loads it")
    dtype, old_name = kwargs.pop("dtype", None), kwargs.pop("torch_dtype", None)
    dtype = nbddp_shard_dtype(dtype if dtype is not None else old_name, config)
    quantizer, dtype = nbddp_quantizer(shown, config, kwargs, dtype, NBDDP_DEVICE)
    pre_quantized = bool(quantizer and quantizer.pre_quantized)
    if kwargs.get("attn_implementation"):
        config._attn_implementation = kwargs.pop("attn_implementation")
    left = nbddp_config_keywords(config, kwargs)
    if left:
        nbddp_say(f"shard-left-{shown}", f"{shown}: {', '.join(left)} not taken by the sharded load")
    nbddp_dist()
    transport, why = nbddp_shard_transport(config, 4 if quantizer else 32 if dtype == torch.float32 else 16)
    quant = {} if quantizer is None else {"skeleton": nbddp_quant_skeleton(quantizer, dtype, NBDDP_DEVICE),
                                          "make": nbddp_quant_maker(NBDDP_DEVICE, dtype, pre_quantized)}
    try:
        model, shards = nbddp_load_sharded(folder, device=NBDDP_DEVICE, dtype=dtype, model_cls=cls, config=config,
                                           transport=transport, **quant)
    except FileNotFoundError as error:
        _nbddp_stop(f"{shown}: {error}; NBDDP_MODE=split loads it in one process over every GPU")
    if quantizer is not None:
        nbddp_quant_finish(model, quantizer)
    model.eval()  # as from_pretrained returns it
    config.name_or_path = os.fspath(name)
    try:
        model.generation_config = transformers.GenerationConfig.from_pretrained(folder)
    except OSError:  # none saved: the one made from the config stays
        pass
    NBDDP_SHARDED.append(shards)
    layers, mine, whole = map(_nbddp_bytes, nbddp_shard_sizes(model, shards))
    nbddp_say(f"shard-{shown}", f"{shown}: loaded sharded over {torch.distributed.get_world_size()} processes, "
                                f"layer by layer: its {len(shards.blocks)} layers' frozen weights {layers}, {mine} on "
                                f"each rank{nbddp_quant_said(quantizer)}; "
                                f"{whole} whole on every rank (embeddings, head, norms); gathers: "
                                + ("copies from shared host memory" if transport == "host" else f"all-gathers ({why})"))
    return model


def nbddp_config_keywords(config, kwargs):
    """As from_pretrained does, each keyword that names a setting of the config sets it; returns the keywords that
    the sharded load neither needs nor takes."""
    left = []
    for key, value in kwargs.items():
        if key in _NBDDP_NOT_NEEDED or key in _NBDDP_QUANTIZE:
            continue
        if hasattr(config, key):
            setattr(config, key, value)
        else:
            left.append(key)
    return left


def nbddp_shard_transport(config, bits):
    """Rank 0's choice of the gathers' transport for every rank (nbddp_host_transport: copies from host memory where
    one machine holds them, else all-gathers), from the frozen layers' bytes the config gives at `bits`."""
    try:
        frozen = nbddp_weight_gib(config.to_dict(), bits, parts=True)[0] * NBDDP_GIB
    except (KeyError, TypeError):  # a config it cannot size: as many bytes as nothing
        frozen = 0
    one_machine = NBDDP_WORLD_SIZE == int(os.environ.get("LOCAL_WORLD_SIZE", NBDDP_WORLD_SIZE))
    choice = [nbddp_host_transport(frozen, one_machine, nbddp_host_available())]
    torch.distributed.broadcast_object_list(choice, src=0)
    return choice[0]


def _nbddp_causal_lm(cls):
    """A causal LM of transformers: the class, or one it derives from (a notebook's own subclass), is one that
    AutoModelForCausalLM maps a model type to."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    causal = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    return any(c.__name__ in causal for c in cls.__mro__)


def _nbddp_sharded_load(whole, cls, name, *args, **kwargs):
    if _nbddp_causal_lm(cls) and not args:
        return nbddp_from_pretrained_sharded(cls, name, **kwargs)
    nbddp_say(f"shard-whole-{cls.__name__}", f"{cls.__name__}.from_pretrained: not a causal LM (or with model "
                                             "arguments): loaded whole on every rank")
    return whole(cls, name, *args, **kwargs)


def _nbddp_patch_from_pretrained(modeling):
    nbddp_wrap_from_pretrained(modeling, "_nbddp_sharded", _nbddp_sharded_load)


def nbddp_sharded_names(module):
    """The names under which `module` holds parameters of a model loaded sharded."""
    sharded = {id(p) for shards in NBDDP_SHARDED for block in shards.blocks for p in block.params}
    return {name for name, p in module.named_parameters(remove_duplicate=False) if id(p) in sharded}


def _nbddp_ddp_leaves_the_shards():
    """A DDP wrap of any module that holds sharded parameters leaves them out of its start-up broadcast and its
    reducer, by the names it holds them under (peft's wrapper names them otherwise than the model loaded)."""
    ddp = torch.nn.parallel.DistributedDataParallel
    init = ddp.__init__
    if getattr(init, "_nbddp_sharded", False):
        return

    @functools.wraps(init)
    def leaving_the_shards(self, module, *args, **kwargs):
        names = nbddp_sharded_names(module)
        if names:
            before = set(module.__dict__.get("_ddp_params_and_buffers_to_ignore", ()))  # its own (peft forwards)
            ddp._set_params_and_buffers_to_ignore_for_model(module, sorted(before | names))
        init(self, module, *args, **kwargs)

    leaving_the_shards._nbddp_sharded = True
    ddp.__init__ = leaving_the_shards


def nbddp_shard_mode_on():
    """The sharded mode's patches (nbddp_fit calls it where it chooses the mode)."""
    NBDDP_IMPORTS.watch("transformers.modeling_utils", _nbddp_patch_from_pretrained)
    _nbddp_ddp_leaves_the_shards()


NBDDP_SHARDABLE.update(share=nbddp_shard_share, start=nbddp_shard_start)
