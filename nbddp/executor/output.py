"""torchrun's stdout and stderr on their way to this process's own: read as they come, decoded (a character split
between two reads comes whole: a progress bar's blocks are 3 bytes), the end of stderr kept for the failure report,
torchrun's own noise held back, and written a few times a second, one write per stream (a notebook front end shows
each write as one output message, and a job's output comes in bursts)."""
from __future__ import annotations

import codecs
import os
import sys
import time

from .failures import LauncherNoise

#: Seconds between two writes of the job's output.
FLUSH_EVERY = 0.25
_TAIL_CHARS = 64 * 1024
_STREAMS = ("stdout", "stderr")


class JobOutput:
    def __init__(self):
        self.decoders = {dest: codecs.getincrementaldecoder("utf-8")(errors="replace") for dest in _STREAMS}
        self.pending = dict.fromkeys(_STREAMS, "")
        self.stderr_tail, self.echo, self.flushed = "", True, 0.0  # echo off: read and kept, not shown
        self.noise = LauncherNoise()

    def read(self, dest: str, fd: int) -> bool:
        """What the pipe of `dest` ("stdout" or "stderr") holds now; False once it is closed."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return True
        text = self.decoders[dest].decode(data, final=not data)
        if text and dest == "stderr":
            self.stderr_tail = (self.stderr_tail + text)[-_TAIL_CHARS:]
            text = self.noise.feed(text)
        if text and self.echo:
            self.pending[dest] += text
        return bool(data)

    def flush(self, due=False) -> None:
        """Write what came since the last write (with `due`, only once FLUSH_EVERY has passed since then)."""
        if due and time.monotonic() - self.flushed < FLUSH_EVERY:
            return
        self.flushed = time.monotonic()
        pending, self.pending = self.pending, dict.fromkeys(_STREAMS, "")
        for dest in (name for name in _STREAMS if pending[name]):
            getattr(sys, dest).write(pending[dest])
            getattr(sys, dest).flush()
