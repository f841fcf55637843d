"""bitsandbytes 4-bit weights loaded straight into the sharded mode (docs/sharded.md, "4-bit loading"): the load of
shard_load.py, with transformers' own quantizer making the skeleton and bitsandbytes' own parameter class making
each weight, one decoder layer at a time on this rank's GPU, the layer sharded at once (shard.py shards a 4-bit
weight's packed bytes and keeps its quantization state whole on every rank).

- Which loads: a 4-bit bitsandbytes quantization asked for (`quantization_config=BitsAndBytesConfig(load_in_4bit=
  True, ...)` or a dict of it, or `load_in_4bit=True`), or a checkpoint whose config.json holds one (pre-quantized:
  the checkpoint's own config wins, the loading attributes asked for are merged, as transformers merges them).
  8-bit and every other method stop with one line (NBDDP_MODE=split loads them).
- The skeleton: transformers' quantizer (`AutoHfQuantizer.from_config`) replaces the meta model's Linear layers by
  bitsandbytes' `Linear4bit` (`preprocess_model`: the head and the modules the config or the model keeps whole are
  left as they are); after the load it marks the model as transformers marks a quantized one (`hf_quantizer`,
  `postprocess_model`: `config.quantization_config`, `is_loaded_in_4bit`).
- Quantize-on-load: each 4-bit weight read from the checkpoint in 16 bits (cast to the load's dtype), made a
  `Params4bit` with the meta parameter's settings and moved to the GPU: bitsandbytes quantizes it there.
- Pre-quantized: the packed `weight` and its state (`weight.absmax`, `weight.quant_map`, `weight.nested_absmax`,
  `weight.nested_quant_map`, `weight.quant_state.bitsandbytes__nf4` or `__fp4`: nbddp_quant_stat_keys) read and
  made one parameter by `Params4bit.from_prequantized`.
bitsandbytes and transformers are imported only where a load uses them (the runtime itself needs torch alone)."""
from .fit import _nbddp_stop
from .split_place import nbddp_quant_asked

NBDDP_QUANT_STATS = ("absmax", "quant_map", "nested_absmax", "nested_quant_map", "quant_state.bitsandbytes__nf4",
                     "quant_state.bitsandbytes__fp4")
_NBDDP_PARAMS4BIT = ("blocksize", "compress_statistics", "quant_type", "quant_storage")  # the meta one's settings


def nbddp_quant_stat_keys(keys, weight):
    """The checkpoint keys of the quantization state of the pre-quantized 4-bit weight stored under `weight` (its
    key followed by one of bitsandbytes' state names), in the order NBDDP_QUANT_STATS names them."""
    keys = set(keys)
    return [f"{weight}.{stat}" for stat in NBDDP_QUANT_STATS if f"{weight}.{stat}" in keys]


def _nbddp_method(quant):
    """'bnb-4bit', 'bnb-8bit', 'bnb-unset' or the method's name, from a quantization config (object or dict)."""
    get = quant.get if isinstance(quant, dict) else (lambda key: getattr(quant, key, None))
    method = get("quant_method") or "bitsandbytes"
    method = str(getattr(method, "value", method))
    if method != "bitsandbytes":
        return method
    return "bnb-8bit" if get("load_in_8bit") else "bnb-4bit" if get("load_in_4bit") else "bnb-unset"


def nbddp_quant_refused(asked, stored):
    """Why the sharded mode cannot load this quantization (None where it can: bitsandbytes 4-bit, asked for or
    stored in the checkpoint; the checkpoint's own wins, as transformers merges them)."""
    quant = stored if stored is not None else asked
    if quant is None:
        return None
    method = _nbddp_method(quant)
    if method == "bnb-4bit":
        return None
    what = "8-bit bitsandbytes" if method == "bnb-8bit" else f"{method} quantization"
    return f"{'its checkpoint is' if stored is not None else 'it asks for'} {what}, which the sharded mode does not " \
           "load (it loads 16 and 32 bits and bitsandbytes 4-bit)"


def nbddp_quantizer(shown, config, kwargs, dtype, device):
    """transformers' quantizer for this load, or None where it is not quantized; (quantizer, dtype): the dtype as
    the quantizer sets it where none was asked for. Stops with one line where the mode cannot load it."""
    asked, stored = nbddp_quant_asked(kwargs), getattr(config, "quantization_config", None)
    if asked is None and stored is None:
        return None, dtype
    why = nbddp_quant_refused(asked, stored)
    if why:
        _nbddp_stop(f"{shown}: {why}: NBDDP_MODE=split loads it in one process over every GPU")
    from transformers import BitsAndBytesConfig
    from transformers.quantizers import AutoHfQuantizer
    if isinstance(asked, dict):
        asked = BitsAndBytesConfig.from_dict({k: v for k, v in asked.items() if k != "quant_method"})
    if stored is not None:
        config.quantization_config = AutoHfQuantizer.merge_quantization_configs(stored, asked)
    else:
        config.quantization_config = asked
    quantizer = AutoHfQuantizer.from_config(config.quantization_config, pre_quantized=stored is not None)
    try:
        quantizer.validate_environment(device_map={"": device}, weights_only=True)
    except ImportError as error:
        _nbddp_stop(f"{shown}: {error}")
    return quantizer, quantizer.update_dtype(dtype) if dtype is None else dtype


def nbddp_quant_skeleton(quantizer, dtype, device):
    """`skeleton(model)` for nbddp_load_sharded: the meta model's Linear layers made bitsandbytes' Linear4bit, as
    transformers' quantizer makes them before it reads a tensor."""
    def skeleton(model):
        quantizer.preprocess_model(model=model, dtype=dtype, device_map={"": device}, checkpoint_files=None,
                                   use_kernels=False)
        return model
    return skeleton


def nbddp_quant_maker(device, dtype, pre_quantized):
    """`make(checkpoint, module, meta, stored)` for the loader: a 4-bit weight (a meta `Params4bit`) made on `device`
    from the checkpoint's key `stored`, quantized here (16-bit checkpoint) or rebuilt from its packed bytes and state
    (pre-quantized); None for any other tensor (the loader makes it)."""
    def make(checkpoint, module, meta, stored):
        if type(meta).__name__ != "Params4bit" or stored is None or stored not in checkpoint:
            return None
        from bitsandbytes.nn import Params4bit
        if pre_quantized:
            stats = {key[len(stored) + 1:]: checkpoint.get(key)
                     for key in nbddp_quant_stat_keys(checkpoint.keys(), stored)}
            return Params4bit.from_prequantized(data=checkpoint.get(stored).to(device), quantized_stats=stats,
                                                requires_grad=False, device=device, module=module)
        value = checkpoint.get(stored).to(device, dtype)
        if tuple(value.shape) != tuple(meta.shape):
            raise ValueError(f"{stored}: {tuple(value.shape)} in the checkpoint, {tuple(meta.shape)} in the model")
        settings = {k: getattr(meta, k) for k in _NBDDP_PARAMS4BIT if hasattr(meta, k)}
        return Params4bit(value, requires_grad=False, module=module, **settings).to(device)  # quantized on the move
    return make


def nbddp_quant_said(quantizer):
    """How the start-up line names a 4-bit load ("" for none)."""
    if quantizer is None:
        return ""
    return ", in 4-bit " + ("(pre-quantized)" if quantizer.pre_quantized else "(quantized on load)")


def nbddp_quant_finish(model, quantizer):
    """The loaded model marked as transformers marks a quantized one (its quantizer, the config's
    quantization_config, is_loaded_in_4bit)."""
    model.hf_quantizer = quantizer
    quantizer.postprocess_model(model)
    return model
