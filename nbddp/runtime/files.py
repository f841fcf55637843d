"""Files, caches and shell commands: once per machine (local rank 0) while the other ranks wait.

Files that code run on every rank writes (what training needs also writes a cache it reads back, a log line, a
record in a module of its own) are written by one rank per machine too: on the machine's other ranks, a file of the
notebook's opened for writing is a copy of this process's own, and opening it again reads that copy, so each rank
reads back what it wrote while the notebook's file gets one writer, whole. The notebook's files are those under the
working folder, and anywhere else but the temporary folder, caches (~/.cache, Hugging Face's, torch's), Python's
installation, /dev, /proc and /sys. A path with this rank's number after a separator or a word for a process
(Trainer's rng_state_1.pth, log_rank1.txt, gpu1/, but not run1/ or model_v1.json), or this process's id, is this
rank's own; so is code the import system reads (.py, .pyc, .so). A sqlite3 database connects to the copy too. A copy
starts from what the file holds when this rank first writes it, rank 0's writes up to then included. Other
writes that do not go through Python's `open` (torch.save's zip writer, memory maps, os.open) are not covered, and a
library that looks a rank's file up by its path (os.path.exists, a glob) finds the machine's file once its rank 0 has
written it, not the rank's copy.
`NBDDP_ONE_WRITER=0` leaves every rank writing."""
import atexit
import builtins
import contextlib
import functools
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

from .group import (NBDDP_AT_START, NBDDP_IS_LOCAL_MAIN, NBDDP_LOCAL_RANK, NBDDP_RANK, NBDDP_RANK_BLOCK,
                    NBDDP_WORLD_SIZE, nbddp_barrier, nbddp_skipped)
from .hooks import NBDDP_IMPORTS, _nbddp_choice


@contextlib.contextmanager
def nbddp_main_process_first():
    """Local rank 0 runs the block first (and fills the datasets cache); the others run it after."""
    if not NBDDP_IS_LOCAL_MAIN:
        nbddp_barrier("data preparation")
    yield
    if NBDDP_IS_LOCAL_MAIN:
        nbddp_barrier("data preparation")


# What torchrun gives each rank to find the others: a program a shell line starts is not one of this job's ranks.
NBDDP_RANK_ENVIRONMENT = frozenset({
    "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
})


def nbddp_child_environment(env=None):
    """The environment of a program the notebook starts: this process's (None), or the one given, without the job's
    rank variables where it copies them from this process (`dict(os.environ, ...)`: the same RANK and run id)."""
    if env is not None and any(env.get(name) != os.environ.get(name) for name in ("RANK", "TORCHELASTIC_RUN_ID")):
        return env  # an environment of its own
    return {name: value for name, value in (os.environ if env is None else env).items()
            if name not in NBDDP_RANK_ENVIRONMENT}


def nbddp_children_outside_the_job():
    """Programs the notebook starts (a `!` line, subprocess, os.system) without an environment of their own get this
    process's without the job's rank variables: a training script the notebook runs (`!python train.py`, accelerate
    or torch.distributed inside it) is one process of its own, as in the notebook, instead of waiting forever for
    ranks of this job that never come; so do one given a copy of this process's environment, os.spawn*'s,
    os.posix_spawn's, and a program a process this rank forked starts (pty.spawn, pexpect: os.exec* in the child). A
    child given an environment of its own keeps it."""
    if NBDDP_WORLD_SIZE == 1 or getattr(subprocess.Popen.__init__, "_nbddp_outside", False):
        return
    init = subprocess.Popen.__init__

    def __init__(self, args, *rest, **kwargs):
        if len(rest) < 10:  # env: the tenth parameter after args
            kwargs["env"] = nbddp_child_environment(kwargs.get("env"))
        init(self, args, *rest, **kwargs)

    __init__._nbddp_outside = True
    subprocess.Popen.__init__ = __init__

    def system(command):
        status = subprocess.call(command, shell=True)  # os.system's wait status, from subprocess's return code
        return status << 8 if status >= 0 else -status

    os.system = system
    rank, execv, execve = os.getpid(), os.execv, os.execve

    def _execv(path, args):  # a process this rank forked (pty.spawn, pexpect) starts a program: outside the job
        return execv(path, args) if os.getpid() == rank else execve(path, args, nbddp_child_environment())

    def _execve(path, args, env):
        return execve(path, args, env if os.getpid() == rank else nbddp_child_environment(env))

    os.execv, os.execve = _execv, _execve  # (os.exec*, os.execvp*: through these; a rank replacing itself stays)
    for name in ("posix_spawn", "posix_spawnp"):
        if hasattr(os, name):
            setattr(os, name, functools.partial(_nbddp_posix_spawn, getattr(os, name)))
    spawn = getattr(os, "_spawnvef", None)  # every os.spawn* (POSIX)
    if spawn is not None:
        with_env = {os.execv: os.execve, os.execvp: os.execvpe}

        def _spawnvef(mode, file, args, env, func):
            return spawn(mode, file, args, nbddp_child_environment(env), with_env.get(func, func))

        os._spawnvef = _spawnvef


def _nbddp_posix_spawn(spawn, path, argv, env, **kwargs):
    return spawn(path, argv, nbddp_child_environment(env), **kwargs)


NBDDP_AT_START.append(nbddp_children_outside_the_job)


def nbddp_shell(command, shell=True, args=None):
    """A notebook `!command`: runs once per machine (local rank 0) while the other ranks wait. A `%%bash` cell with
    arguments on its line (`%%bash -s "$x"`, expanded as IPython expands it) runs as IPython runs it: the shell
    with those arguments, the cell's text on its standard input."""
    if NBDDP_IS_LOCAL_MAIN:
        sys.stdout.flush()
        captured = isinstance(sys.stdout, io.StringIO)  # inside %%capture: the output is kept there
        pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT} if captured else {}
        if args is not None:
            done = subprocess.run([shell, *shlex.split(args)], input=command, text=True, **pipe)
        else:
            done = subprocess.run(command, shell=True, executable=None if shell is True else shell, text=True, **pipe)
        if captured:
            sys.stdout.write(done.stdout)
        if done.returncode:
            print(f"nbddp: shell command exited with status {done.returncode}: {command}", file=sys.stderr)
    nbddp_barrier(f"shell command {command[:60]}")


class NbddpLines(list):
    """What `x = !command` binds, as IPython's SList: the output's lines, also as `.s` (joined by spaces), `.n`
    (by newlines) and `.l` (the list)."""

    s = spstr = property(" ".join)
    n = nlstr = property("\n".join)
    l = property(list)  # noqa: E741 - IPython's name


def nbddp_getoutput(command):
    """A notebook `x = !command`: the output lines."""
    done = subprocess.run(command, shell=True, capture_output=True, text=True)
    return NbddpLines((done.stdout + done.stderr).splitlines())


def nbddp_write_file(path, text, append=False):
    """A notebook `%%writefile` cell: written once per machine, the other ranks wait."""
    if NBDDP_IS_LOCAL_MAIN:
        with open(path, "a" if append else "w", encoding="utf-8") as fh:
            fh.write(text)
    nbddp_barrier(f"writing {path}")


_NBDDP_CODE = (".py", ".pyc", ".so", ".pth")


class NbddpOwnCopies:
    """`open` on a rank other than its machine's rank 0: the notebook's files written and read back as this
    process's own copies (see the module's docstring)."""

    def __init__(self, real_open, ranks=(NBDDP_RANK, NBDDP_LOCAL_RANK)):
        self.real_open, self.copies, self.folder = real_open, {}, None
        self.cwd = os.path.join(os.path.realpath(os.getcwd()), "")
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        caches = [cache, sys.prefix, sys.base_prefix, sys.exec_prefix] + [os.environ[name] for name in (
            "HF_HOME", "HF_HUB_CACHE", "HF_DATASETS_CACHE", "TRANSFORMERS_CACHE", "TORCH_HOME", "TRITON_CACHE_DIR")
            if os.environ.get(name)]
        self.caches = tuple(os.path.join(os.path.realpath(root), "") for root in caches)
        self.system = tuple(os.path.join(os.path.realpath(root), "")
                            for root in (tempfile.gettempdir(), "/dev", "/proc", "/sys"))
        numbers = "|".join({str(rank) for rank in ranks if rank}) or "(?!)"
        self.own = re.compile(rf"(?:(?:^|[/_.-]|rank|proc|process|gpu|cuda|device|worker)({numbers})|(?<!\d){os.getpid()})"
                              r"(?!\d)", re.I)

    def is_notebooks(self, path) -> bool:
        """A file of the notebook's, whose path does not name this rank, and not code the import system reads
        around `open` (Unsloth's compiled modules, a module the code writes to import it)."""
        if path.endswith(_NBDDP_CODE):
            return False
        inside = path.startswith(self.cwd)
        if path.startswith(self.caches) or (not inside and path.startswith(self.system)):
            return False
        return not self.own.search(path[len(self.cwd):] if inside else path)

    def __call__(self, file, mode="r", *args, **kwargs):
        writes = any(c in mode for c in "wax+") and not NBDDP_RANK_BLOCK[0]  # (in the notebook's own rank test)
        if not isinstance(file, (str, bytes, os.PathLike)) or not (writes or self.copies):  # a descriptor, a read
            return self.real_open(file, mode, *args, **kwargs)
        path = os.path.realpath(os.fsdecode(file))  # only for a write, or a read while this rank has copies
        if path in self.copies:
            return self.real_open(self.copies[path], mode, *args, **kwargs)
        if not writes or not self.is_notebooks(path):
            return self.real_open(file, mode, *args, **kwargs)
        return self.real_open(self.copy_of(path, fresh=any(c in mode for c in "wx")), mode, *args, **kwargs)

    def copy_of(self, path, fresh=False):
        """This rank's copy of a file of the notebook's, made from what is there unless the file is written anew."""
        if self.folder is None:
            self.folder = tempfile.mkdtemp(prefix=f"nbddp-rank{NBDDP_RANK}-copies-")
            atexit.register(shutil.rmtree, self.folder, True)
        copy = os.path.join(self.folder, f"{len(self.copies)}-{os.path.basename(path)}")
        if not fresh and os.path.isfile(path):  # appended to or changed: from what is there
            with self.real_open(path, "rb") as source, self.real_open(copy, "wb") as target:
                shutil.copyfileobj(source, target)
        self.copies[path] = copy
        nbddp_skipped(f"{os.path.basename(path)} (its own copy)")
        return copy


def _nbddp_own_databases(module):
    """sqlite3 opens its file for reading and writing outside `open`: on a rank with copies, a database file of the
    notebook's is this rank's copy too (`sqlite3.connect('metrics.db')`, also through a library that connects)."""
    connect = module.connect

    @functools.wraps(connect)
    def own_connect(database, *args, **kwargs):
        opener = builtins.open
        if isinstance(opener, NbddpOwnCopies) and isinstance(database, (str, bytes, os.PathLike)) and \
                not kwargs.get("uri") and os.fsdecode(database) not in ("", ":memory:") and not NBDDP_RANK_BLOCK[0]:
            path = os.path.realpath(os.fsdecode(database))
            database = opener.copies.get(path) or (opener.copy_of(path) if opener.is_notebooks(path) else database)
        return connect(database, *args, **kwargs)

    module.connect = own_connect
    if getattr(module, "dbapi2", module) is not module:
        module.dbapi2.connect = own_connect


def nbddp_own_copies():
    """Install `NbddpOwnCopies` as `open` on a rank other than its machine's rank 0, as the script starts (a plain
    script that only calls this module's helpers, bench's baseline, does not start it)."""
    if NBDDP_WORLD_SIZE > 1 and not NBDDP_IS_LOCAL_MAIN and _nbddp_choice("NBDDP_ONE_WRITER") is not False and \
            not isinstance(builtins.open, NbddpOwnCopies):
        builtins.open = io.open = NbddpOwnCopies(builtins.open)
        NBDDP_IMPORTS.watch("sqlite3", _nbddp_own_databases)


NBDDP_AT_START.append(nbddp_own_copies)
