"""LoraConfig(ensure_weight_tying=...) on a peft that lacks the field (Unsloth's notebooks pass it): accepted and
ignored, with one line that says so. No change where peft has the field."""
import functools
import inspect

from .hooks import NBDDP_IMPORTS, nbddp_say


def _nbddp_patch_peft(module):
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
