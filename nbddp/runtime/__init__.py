"""The code a generated script carries, one module per job.

Each module is ordinary Python that tests import. A generated script imports nothing from nbddp: the converter
inlines the source of the modules a notebook needs (`nbddp/inline.py`), so names are shared between modules
through `from .module import name` lines, which inlining drops. Importing this package imports no module of it
(the converter reads their files and never imports torch).
"""

# Inlining order where no import decides it; a module's `from .x import` lines put x before it.
MODULES = ("recipe", "launcher", "wait", "group", "fit", "files", "hooks", "one_writer", "agree", "ask", "ipython_forms", "unsloth_group",
           "checkpoint", "strategy", "lean_sync", "tiled_mlp", "peft_shim", "xformers_shim", "global_batch", "balance",
           "loop")
