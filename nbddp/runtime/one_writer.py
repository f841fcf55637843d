"""One writer at run time, a net under the converter's guards: on ranks other than global rank 0, the saving and
pushing methods of transformers, peft and Unsloth, and wandb's run start, do nothing. That covers saves the
converter cannot see: in a module the notebook imports, in code built at run time, inside a library helper.

A call the converter already made rank-0-only never runs on the other ranks, so nothing changes there (no second
barrier). Where every rank makes the call, the other ranks skip it and wait, through the store, until rank 0 has
finished the same call (the same line, the same time), so a later load of the folder finds it whole; they stop
waiting if rank 0 reaches the next barrier without making it. The Trainer's checkpoints call save_pretrained on its
main process only, so they are unchanged (with `save_on_each_node`, other machines skip theirs); its save_model
itself is not wrapped, as it must run on every rank under FSDP or DeepSpeed. The notebook's own Trainer callbacks
write files and print on rank 0 only (their hooks still run everywhere). Logging's handlers that send records to
another machine (HTTP, sockets, mail, syslog) send them from rank 0 only."""
import builtins
import contextlib
import functools
import io
import operator
import os
import sys
import time
import types

from .group import NBDDP_AT_TEARDOWN, NBDDP_IS_MAIN, NBDDP_RANK_BLOCK, NBDDP_STARTED, NBDDP_WORLD_SIZE, nbddp_skipped
from .hooks import NBDDP_IMPORTS, _nbddp_choice, nbddp_say
from .wait import nbddp_store, nbddp_store_barrier

NBDDP_ONE_WRITER = NBDDP_WORLD_SIZE > 1 and _nbddp_choice("NBDDP_ONE_WRITER") is not False
_NBDDP_WRITES = {"depth": 0, "sites": {}, "saved": {}}  # saved: where -> what saved there
_NBDDP_WRITERS = {  # module -> class -> methods
    "transformers.modeling_utils": {"PreTrainedModel": ("save_pretrained", "push_to_hub")},
    "transformers.utils.hub": {"PushToHubMixin": ("push_to_hub",)},
    "transformers.tokenization_utils_base": {"PreTrainedTokenizerBase": ("save_pretrained",)},
    "transformers.processing_utils": {"ProcessorMixin": ("save_pretrained",)},
    "transformers.configuration_utils": {"PretrainedConfig": ("save_pretrained",),
                                         "PreTrainedConfig": ("save_pretrained",)},
    "peft.peft_model": {"PeftModel": ("save_pretrained",)},
}


@contextlib.contextmanager
def nbddp_rank_block():
    """The body of the notebook's own test of the rank (`if dist.get_rank() == 1:`): what it saves and writes there,
    this rank saves and writes as the notebook says (neither the rank-0 net nor a copy of its own, files.py)."""
    NBDDP_RANK_BLOCK[0] += 1
    try:
        yield
    finally:
        NBDDP_RANK_BLOCK[0] -= 1


def nbddp_in_rank_block():
    """True inside the body of the notebook's own test of the rank (nbddp_rank_block): a logging handler of the
    notebook's sends the records that body logs from the rank it picks
    (`if NBDDP_IS_MAIN or nbddp_in_rank_block():`)."""
    return NBDDP_RANK_BLOCK[0] > 0


class NbddpWriter:
    """A saving method, run on global rank 0 only. Objects that hold it travel to other processes (datasets' map
    workers get the tokenizer their function uses), where a function of the script would travel by value, with every
    function of the script it reaches, and so would a library's method that is no longer where it was defined. So a
    writer pickles by reference: as its class's attribute (`owner`), else as the method it wraps."""
    _nbddp_one_writer = True

    def __init__(self, method, name, owner=None):
        functools.update_wrapper(self, method)
        self.method, self.name, self.owner = method, name, owner

    def __call__(self, *args, **kwargs):
        return self.write(sys._getframe(1), args, kwargs)

    def __reduce__(self):
        return (getattr, (self.owner, self.name)) if self.owner else (operator.itemgetter(0), ((self.method,),))

    def write(self, caller, args, kwargs):
        """A call made at `caller`: it runs on rank 0 (a call from inside another patched call runs as it is); another
        rank notes it and waits for rank 0's."""
        state = _NBDDP_WRITES
        if state["depth"] or NBDDP_RANK_BLOCK[0]:
            return self.method(*args, **kwargs)
        site = f"{caller.f_code.co_filename}:{caller.f_lineno}"
        count = state["sites"][site] = state["sites"].get(site, 0) + 1
        key = f"nbddp/wrote/{site}/{count}"
        if not NBDDP_IS_MAIN:
            return nbddp_skipped(self.name, key)
        where = args[1] if len(args) > 1 else kwargs.get("save_directory", kwargs.get("repo_id"))
        if isinstance(where, (str, os.PathLike)):
            state["saved"].setdefault(os.fspath(where), []).append(self.name)
        state["depth"] += 1
        try:
            return self.method(*args, **kwargs)
        finally:
            state["depth"] -= 1
            store = nbddp_store()
            if store is not None:
                store.set(key, "1")


def _nbddp_write(*args, **kwargs):  # the code of every class-level writer; `writer` is in its own globals
    return writer.write(sys._getframe(1), args, kwargs)  # noqa: F821


def nbddp_one_writer(method, name, owner=None):
    """A class's saving method, run on global rank 0 only. A function, since transformers copies some by their code
    (copy_func), and a copy, or this function once a later patch displaces it, pickles by value, with its globals:
    so its globals are its own, `sys` and the writer (also its `__wrapped__`, which signatures follow to `method`),
    not the script's (datasets' map workers got every function of the script, and a torch config module that
    cannot be pickled)."""
    if getattr(method, "_nbddp_one_writer", False):
        return method
    writer = NbddpWriter(method, name, owner)
    write = functools.update_wrapper(
        types.FunctionType(_nbddp_write.__code__, {"sys": sys, "writer": writer}, name), method)
    write._nbddp_one_writer, write.__wrapped__ = True, writer
    return write


def _nbddp_patch_writers(module):
    for cls_name, methods in _NBDDP_WRITERS.get(module.__name__, {}).items():
        cls = getattr(module, cls_name, None)
        for name in methods if NBDDP_ONE_WRITER and cls is not None else ():
            if name in vars(cls):
                setattr(cls, name, nbddp_one_writer(vars(cls)[name], name, cls))


def nbddp_one_writer_attached(obj):
    """The saving methods Unsloth attaches to one model or tokenizer (save_pretrained_merged, push_to_hub_gguf, …)."""
    for name, value in list(vars(obj).items()) if NBDDP_ONE_WRITER and hasattr(obj, "__dict__") else ():
        if name.startswith(("save_pretrained", "push_to_hub", "save_lora")) and callable(value):
            if not getattr(value, "_nbddp_one_writer", False):
                setattr(obj, name, NbddpWriter(value, name))
    return obj


def _nbddp_patch_unsloth_save(module):
    attach = module.patch_saving_functions
    if NBDDP_ONE_WRITER and not getattr(attach, "_nbddp_one_writer", False):
        @functools.wraps(attach)
        def patch_saving_functions(model, *args, **kwargs):
            return nbddp_one_writer_attached(attach(model, *args, **kwargs) or model)

        patch_saving_functions._nbddp_one_writer = True
        module.patch_saving_functions = patch_saving_functions


def _nbddp_patch_wandb(module):
    init = module.init
    if NBDDP_ONE_WRITER and not NBDDP_IS_MAIN and not getattr(init, "_nbddp_one_writer", False):
        @functools.wraps(init)
        def disabled_init(*args, **kwargs):
            nbddp_skipped("wandb.init")
            return init(*args, **{**kwargs, "mode": "disabled"})

        disabled_init._nbddp_one_writer = True
        module.init = disabled_init


@contextlib.contextmanager
def nbddp_writes_nowhere():
    """Files opened for writing (any mode with w, a, x or +) are the null device, and prints go nowhere."""
    real_open = builtins.open

    def nowhere(file, mode="r", *args, **kwargs):
        if isinstance(file, int) or not any(c in mode for c in "wax+"):
            return real_open(file, mode, *args, **kwargs)
        return real_open(os.devnull, mode.replace("x", "w").replace("r+", "w"), *args, **kwargs)

    builtins.open = io.open = nowhere
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        builtins.open = io.open = real_open


def _nbddp_patch_callbacks(module):
    """The notebook's own Trainer callbacks run their hooks on every rank (the Trainer calls them everywhere, and
    what they decide must agree); on ranks other than 0, what they write to files and print goes nowhere."""
    call_event = module.CallbackHandler.call_event
    if NBDDP_IS_MAIN or not NBDDP_ONE_WRITER or getattr(call_event, "_nbddp_one_writer", False):
        return

    @functools.wraps(call_event)
    def quiet_call_event(self, *args, **kwargs):
        if not any(type(callback).__module__ == "__main__" for callback in self.callbacks):
            return call_event(self, *args, **kwargs)
        with nbddp_writes_nowhere():
            return call_event(self, *args, **kwargs)

    quiet_call_event._nbddp_one_writer = True
    module.CallbackHandler.call_event = quiet_call_event


def _nbddp_report_end():
    """Rank 0 says which saves and files the other ranks left to it (their own output is rarely shown), then the
    job's end line."""
    store = nbddp_store()
    if store is None or not NBDDP_ONE_WRITER:
        return
    nbddp_store_barrier("the end of the script")  # every rank's skips are in the store after it
    skipped = {}
    if NBDDP_IS_MAIN:
        for i in range(1, store.add("nbddp/skips", 0) + 1):
            rank, name = store.get(f"nbddp/skip/{i}").decode().split(" ", 1)
            skipped.setdefault(int(rank), []).append(name)
    if skipped:
        said = "; ".join(f"rank {rank} skipped {', '.join(names)}" for rank, names in sorted(skipped.items()))
        nbddp_say("one-writer", f"saved and written once ({said}; NBDDP_ONE_WRITER=0: every rank writes)")
    if NBDDP_IS_MAIN:
        nbddp_say("end", nbddp_end_line(_NBDDP_WRITES["saved"], time.time() - NBDDP_STARTED))


def nbddp_end_line(saved, seconds, error_file=None):
    """The job's last line: it ended well, in how long, what rank 0 saved where through a library's save (a file
    written otherwise, `torch.save`, is not counted: nothing is said then), and where the other ranks' output went
    (torchrun's files for them, kept after the job, or this console)."""
    line = f"done (status 0) in {seconds:.1f} s"
    if saved:
        line += "; saved by rank 0, once: " + ", ".join(f"{where} ({', '.join(dict.fromkeys(names))})"
                                                        for where, names in saved.items())
    if NBDDP_WORLD_SIZE == 1:
        return line
    error_file = error_file or os.environ.get("TORCHELASTIC_ERROR_FILE", "")
    attempt = os.path.dirname(os.path.dirname(error_file))
    if error_file and os.path.isfile(os.path.join(attempt, "1", "stderr.log")):
        return f"{line}; each other rank's output: {os.path.join(attempt, '<local rank>', 'stderr.log')} (and " \
               f"stdout.log; on each machine)"
    return f"{line}; the other ranks' warnings and errors: on this console"


def _nbddp_patch_senders(module):
    """On ranks other than 0, logging's handlers that send each record to another machine or program (HTTP, a socket
    or datagram, mail, syslog) drop it: rank 0 sends it, once for the job (the body of the notebook's own test of the
    rank sends its records as written)."""
    for cls in (module.HTTPHandler, module.SocketHandler, module.SMTPHandler, module.SysLogHandler):
        if "emit" in vars(cls) and not getattr(cls.emit, "_nbddp_once", False):
            def emit(self, record, emit=cls.emit):
                if NBDDP_RANK_BLOCK[0]:
                    emit(self, record)

            emit._nbddp_once = True
            cls.emit = emit


def _nbddp_watch_writers():
    for module in _NBDDP_WRITERS:
        NBDDP_IMPORTS.watch(module, _nbddp_patch_writers)
    if not NBDDP_IS_MAIN and NBDDP_ONE_WRITER:
        NBDDP_IMPORTS.watch("logging.handlers", _nbddp_patch_senders)
    NBDDP_IMPORTS.watch("unsloth.save", _nbddp_patch_unsloth_save)
    NBDDP_IMPORTS.watch("wandb", _nbddp_patch_wandb)
    NBDDP_IMPORTS.watch("transformers.trainer_callback", _nbddp_patch_callbacks)
    NBDDP_AT_TEARDOWN.append(_nbddp_report_end)


_nbddp_watch_writers()
