"""One rank of a `%ddp` session: `python -m nbddp.cellwise.worker`, started by torchrun, once per GPU.

It sets up what a generated script sets up before the notebook's first line (the runtime's rank facts, this rank's
device, the process group: `nbddp.runtime.group.nbddp_start`), by importing nbddp's runtime modules as ordinary
modules, then runs the cells the kernel sends, one at a time, in one namespace that lives as long as the session
(a `__main__` module of its own, as IPython has, so that functions defined in cells pickle as the notebook's).

Where Unsloth is installed and not yet imported, the process group waits for the notebook's `import unsloth`
(runtime/unsloth_group.py, as in a generated script): the session cannot know whether a later cell imports it, and
Unsloth's import must not find a group. The Trainer (accelerate) starts it if it is needed earlier.

nbddp's own barriers (after rank-0 work, main-process-first data, shell lines) go through the kernel instead of
torch.distributed (`Worker.barrier`), so that a rank waiting there can be interrupted and the session survives a
rank that failed while the others waited for it.

A cell's last expression is shown (rank 0) as the notebook shows it: the converter hands it to `nbddp_show`
(nbddp/transforms/show.py), which here is the session's display hook, formatted by IPython's own formatters; a
`display(...)` the notebook calls without an import is IPython's own display on rank 0.

The rank leaves when the kernel says stop (after a barrier, the group closed), and at once when its connection
closes without a stop: the kernel is gone.
"""
from __future__ import annotations

import builtins
import importlib
import importlib.util
import linecache
import os
import queue
import signal
import sys
import threading
import traceback
import types

from . import wire
from .display import Display
from .stop import Stopper

#: the runtime's names a converted cell may read
PUBLIC = ("nbddp_", "NBDDP_", "Nbddp")
_FRAMES = 10


class Runtime:
    """nbddp's runtime modules, imported as a cell first needs them, and the cells' namespace. Their
    `nbddp_barrier` is the session's own (`Worker.barrier`)."""

    def __init__(self, barrier):
        import torch

        self.barrier = barrier
        self.own = {}  # the session's own versions of runtime names (the display hook), kept over the runtime's
        self.main = types.ModuleType("__main__")
        self.main.__dict__.update(__builtins__=builtins, os=os, sys=sys, torch=torch)
        sys.modules["__main__"] = self.main
        self.loaded = []

    def need(self, names):
        for name in names:
            if name not in self.loaded:
                module = importlib.import_module(f"nbddp.runtime.{name}")
                for loaded in [m for key, m in sys.modules.items() if key.startswith("nbddp.runtime.")]:
                    if getattr(loaded, "nbddp_barrier", self.barrier) is not self.barrier:
                        loaded.nbddp_barrier = self.barrier  # also in the modules this one imported
                self.main.__dict__.update({k: v for k, v in vars(module).items() if k.startswith(PUBLIC)})
                self.main.__dict__.update(self.own)
                self.loaded.append(name)


def format_failure(exc: BaseException, name: str, label: str, source: str, lines=None) -> str:
    """The traceback with the cell's frames as `Cell In[7], line 3: text`, the line and text of the user's own cell:
    through `lines` (a converted line -> the cell's line it came from: the conversion's map), else where its text
    appears there once; the converted cell's line otherwise."""
    te = traceback.TracebackException.from_exception(exc)
    stack = list(te.stack)
    while stack and stack[0].filename != name:
        stack.pop(0)  # the worker's own frame
    mine = [i for i, frame in enumerate(stack) if frame.filename == name]
    keep = set(mine) | set(range(max(mine[-1] + 1 if mine else 0, len(stack) - _FRAMES), len(stack)))
    original = [line.strip() for line in source.splitlines()]
    out, skipped = ["Traceback (most recent call last):"], False
    for i, frame in enumerate(stack):
        if i not in keep:
            if not skipped:
                out.append("  ...")
            skipped = True
            continue
        skipped = False
        text = (frame.line or "").strip()
        if frame.filename == name:
            mapped = (lines or {}).get(frame.lineno) or (original.index(text) + 1 if text and original.count(text) == 1
                                                           else None)
            if mapped and mapped <= len(original):
                number, text = mapped, original[mapped - 1]
            else:
                number = frame.lineno
            out.append(f"  {label}, line {number}: {text}")
        else:
            out.append(f'  File "{frame.filename}", line {frame.lineno}, in {frame.name}')
            if text:
                out.append(f"    {text}")
    out += [line.rstrip("\n") for line in te.format_exception_only()]
    return "\n".join(out)


class Worker:
    def __init__(self, conn):
        self.conn, self.lock = conn, threading.Lock()
        self.rank = int(os.environ.get("RANK", "0"))
        self.inbox = queue.Queue()
        self.stopper = Stopper()
        self.cell, self.barriers = None, 0

    def send(self, message):
        with self.lock:  # displays may come from other threads
            wire.send(self.conn, message)

    def _read(self):
        """The kernel's messages, into the inbox; a connection closed without STOP means the kernel is gone."""
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                os._exit(3)
            self.inbox.put(message)
            if message[0] == wire.STOP:
                return

    def start(self):
        self.send((wire.HELLO, {"rank": self.rank, "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
                                "pid": os.getpid()}))
        threading.Thread(target=self._read, daemon=True, name="nbddp-session-inbox").start()
        from ..runtime import group, hooks

        self.torch_barrier = group.nbddp_barrier
        self.runtime = Runtime(self.barrier)
        self.runtime.need(["group", "same_random", "hooks", "files"])  # files: each file one writer per machine

        self.display = Display(self.send, main=group.NBDDP_IS_MAIN)
        from ..runtime.ipython_forms import nbddp_no_ipython  # the same on every rank, as in a script

        self.runtime.own.update(nbddp_show=self.display.show, display=self.display.display, get_ipython=nbddp_no_ipython)
        self.runtime.main.__dict__.update(self.runtime.own)
        unsloth_first = "unsloth" not in sys.modules and importlib.util.find_spec("unsloth") is not None
        group.nbddp_start(group=not unsloth_first)
        if unsloth_first:
            self.runtime.need(["unsloth_group"])
            hooks.nbddp_say("session-unsloth", "Unsloth is installed here: the process group starts right after "
                                               "the notebook's `import unsloth`")
        hooks.NBDDP_IMPORTS.watch("transformers.trainer", self.stopper.patch_trainer)
        self.stopper.install()
        self.send((wire.READY, {}))

    def loop(self):
        while True:
            try:
                kind, fields = self.inbox.get()
                if kind == wire.STOP:
                    return
                if kind == wire.CELL:
                    self.run(fields)  # (a GO here is late: its barrier was interrupted)
            except KeyboardInterrupt:  # an interrupt that came after this rank finished its cell
                continue

    def run(self, fields):
        name, label = fields["name"], fields["label"]
        code, source = fields["code"], fields["source"]
        linecache.cache[name] = (len(code), None, code.splitlines(True), name)
        self.stopper.new_cell()
        self.cell, self.barriers = fields["id"], 0
        try:
            self.runtime.need(fields["modules"])
            exec(compile(code, name, "exec", dont_inherit=True), self.runtime.main.__dict__)
            self.display.after_cell()
        except BaseException as exc:  # noqa: B036 - a cell's SystemExit and KeyboardInterrupt are reported too
            self._flush()
            lines = {int(k): v for k, v in (fields.get("lines") or {}).items()}
            self.send((wire.FAILED, {"id": fields["id"], "traceback": format_failure(exc, name, label, source, lines),
                                     "interrupted": isinstance(exc, KeyboardInterrupt)}))
            return
        self._flush()
        self.send((wire.DONE, {"id": fields["id"]}))

    def barrier(self, *args, **kwargs):
        """The session's `nbddp_barrier`: every rank tells the kernel it got here and waits for the kernel's go.
        Unlike a collective, the wait is Python's, so an interrupt stops it, and a rank that failed leaves the
        others stoppable where they wait for it (the ranks that follow the converter's rank-0 guards wait here)."""
        self.barriers += 1
        self._flush()
        self.send((wire.BARRIER, {"id": self.cell, "n": self.barriers}))
        while True:
            kind, fields = self.inbox.get()
            if kind == wire.GO and (fields["id"], fields["n"]) == (self.cell, self.barriers):
                return

    @staticmethod
    def _flush():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass

    def leave(self):
        from ..runtime import group

        group.nbddp_barrier = self.torch_barrier  # the kernel no longer answers: torch's own barrier
        group.nbddp_teardown()
        self._flush()


def main():
    signal.signal(signal.SIGINT, signal.default_int_handler)
    worker = Worker(wire.connect())
    worker.start()
    worker.loop()
    worker.leave()
    os._exit(0)  # not Python's exit: it can hang freeing DDP's reducers while gloo's threads wait for the GIL


if __name__ == "__main__":
    main()
