"""The code a generated script carries, one module per job, and its API: the helpers a conversion step may write.

Each module is ordinary Python that tests import. A generated script imports nothing from nbddp: the converter
writes the source of the modules a notebook needs beside it, or inlines it (`nbddp/inline.py`), so names are shared
between modules through `from .module import name` lines, which that drops. Importing this package imports no
module of it (the converter reads their files and never imports torch).

HELPERS is the explicit API between the converter and the runtime: every name a step writes into a script (each
step declares its own in `TreeStep.inserts`), the module that defines it, why, and whether every rank calls it
together (it may wait for the others: nbddp.needs runs such a line on every rank). The script carries a module
because the converted notebook holds one of its helpers (nbddp/transforms/runtime_needs.py), or for what the
notebook itself does (a Trainer, Unsloth, a prompt).
"""
from typing import NamedTuple

# Inlining order where no import decides it; a module's `from .x import` lines put x before it.
MODULES = ("hash_seed", "recipe", "launcher", "wait", "group", "same_random", "split_place", "fit", "hooks", "one_writer",
           "files", "file_races", "agree", "share", "stdin_fd", "owner", "ask", "ipython_forms", "unsloth_group",
           "checkpoint", "strategy", "lean_sync", "tiled_mlp", "peft_shim", "xformers_shim", "global_batch", "balance",
           "loop", "shard_host", "shard", "shard_load", "shard_quant",
           "shard_mode")

EARLY = ("hash_seed",)  # modules whose code a script runs before its third-party imports (torch's)


class Helper(NamedTuple):
    module: str
    why: str
    together: bool = False  # every rank calls it: it may wait for the others


# What the runtime's nets for code written for one process change on ranks other than 0, besides saves (the
# vocabulary's SAVE: one_writer, files' own copies): the libraries whose calls they intercept (logging's senders, a
# rank's own copy of a sqlite database, wandb's run). The notebook's own rank test turns them off (rank_blocks).
NETTED = frozenset({"logging", "sqlite3", "wandb"})
_FILES = "once per machine, the other ranks wait"
_FORMS = "what IPython gives a notebook, in a script"
_LOOP = "a training loop of the notebook's own: one model over every rank"
HELPERS = {
    "NBDDP_IS_MAIN": Helper("group", "rank 0's blocks"),
    "NBDDP_RANK": Helper("group", "this process's rank"),
    "NBDDP_LOCAL_RANK": Helper("group", "this process's rank on its machine: its GPU"),
    "NBDDP_DEVICE": Helper("group", "this process's device"),
    "nbddp_device_map": Helper("group", "a model load on this rank's device"),
    "nbddp_rank_block": Helper("one_writer", "the notebook's own test of the rank: what it writes there, as written"),
    "nbddp_in_rank_block": Helper("one_writer", "a logging handler of the notebook's: what it sends, from rank 0 and "
                                                "from the rank the notebook's own test picks"),
    "nbddp_barrier": Helper("group", "the other ranks wait for rank-0 work", True),
    "nbddp_no_context": Helper("group", "a tracker's run as a context, opened on rank 0 only"),
    "nbddp_rest_on_rank0": Helper("group", "where training ends: rank 0 runs the rest alone", True),
    "nbddp_main_process_first": Helper("files", "data preparation: " + _FILES, True),
    "nbddp_shell": Helper("files", "a shell command: " + _FILES, True),
    "nbddp_write_file": Helper("files", "a %%writefile cell: " + _FILES, True),
    "nbddp_share_files": Helper("share", "what rank 0 saved and every rank loads next, on machines without its "
                                "storage", True),
    "nbddp_share_values": Helper("share", "rank 0's values of a line training needs that generates or reads the "
                                 "clock, given to every rank", True),
    "nbddp_same_values": Helper("share", "rank 0's plain values of a line every rank runs that another library made "
                                "(an id, a run name), on every rank", True),
    "nbddp_getoutput": Helper("files", "a shell command's output as a value"),
    "nbddp_expand": Helper("ipython_forms", _FORMS + ": $name and {expr} in a shell or magic line"),
    "nbddp_env": Helper("ipython_forms", _FORMS + ": %env of a computed line; every rank sets its own environment",
                        True),
    "nbddp_time": Helper("ipython_forms", _FORMS + ": %time of a value"),
    "nbddp_run_file": Helper("ipython_forms", _FORMS + ": %run of a file, its names then the notebook's; a file "
                             "that trains runs as this job's ranks", True),
    "nbddp_capture": Helper("ipython_forms", _FORMS + ": %%capture bound to a name"),
    "nbddp_show": Helper("ipython_forms", _FORMS + ": a cell's last value shown"),
    "nbddp_history": Helper("ipython_forms", _FORMS + ": the output and input history (Out, _, _N, In, _iN)"),
    "nbddp_cell_input": Helper("ipython_forms", _FORMS + ": a cell's input in the history, as the cell starts"),
    "nbddp_batch_as_written": Helper("global_batch", "an accumulation the notebook computes from the world size: kept"),
    "nbddp_ddp": Helper("loop", _LOOP + ": the model trains through DDP", True),
    "nbddp_distributed": Helper("loop", _LOOP + ": each rank reads its share of the data", True),
    "nbddp_unsynced_loop": Helper("loop", _LOOP + ": a loop whose model nbddp cannot tell stops the script", True),
}
