"""One-line messages, NBDDP_* switches, and the post-import hook that patches a library when the notebook first
imports it (never before: Unsloth must be imported before transformers, trl and peft)."""
import importlib.util
import os
import sys

from .group import NBDDP_IS_MAIN

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
    return True if value in ("1", "true", "yes", "on") else False if value in ("0", "false", "no", "off") else None


def _nbddp_flag(name):
    return _nbddp_choice(name) is True


def _nbddp_patch(name, module, patches):
    for patch in patches:
        try:
            patch(module)
        except Exception as exc:  # a patch must never break the notebook's import
            nbddp_say(f"patch-{name}-{patch.__name__}", f"{patch.__name__} skipped ({type(exc).__name__}: {exc})")


class _NbddpPostImport:
    """Runs patch functions right after a watched module is first imported (a sys.meta_path finder)."""

    def __init__(self):
        self.patches = {}

    def watch(self, name, patch):
        if name in sys.modules:
            _nbddp_patch(name, sys.modules[name], [patch])
        else:
            self.patches.setdefault(name, []).append(patch)

    def find_spec(self, name, path=None, target=None):
        patches = self.patches.pop(name, None)
        spec = importlib.util.find_spec(name) if patches else None  # the other finders: the name is no longer ours
        loader = getattr(spec, "loader", None)
        if hasattr(loader, "exec_module") and not isinstance(loader, type):  # a loader of its own, not a class
            run = loader.exec_module

            def exec_module(module):
                run(module)
                _nbddp_patch(name, module, patches)

            loader.exec_module = exec_module
        return spec


NBDDP_IMPORTS = _NbddpPostImport()
sys.meta_path.insert(0, NBDDP_IMPORTS)
