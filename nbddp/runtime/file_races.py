"""A file operation that code on every rank makes, as the notebook made it once: the rank that comes second finds the
folder made or the file moved by another rank of this job and goes on. What was there before the job still raises
as it did."""
import os
import pathlib
import shutil
import sys
import time

from .group import NBDDP_AT_START, NBDDP_RANK, NBDDP_WORLD_SIZE
from .wait import nbddp_store

NBDDP_MADE_KEY = "nbddp/made/{}"  # a folder a rank of this job made (its real path)


def _nbddp_done_by_another(store, key):
    """What another rank of this job recorded under `key` for the same file operation (it records right after doing
    it: waited for up to 2 s), or None."""
    deadline = time.monotonic() + 2
    while store is not None and not store.check([key]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return store.get(key).decode() if store is not None and store.check([key]) else None


def nbddp_folders_once():
    """A folder the notebook makes without exist_ok in code every rank runs (`os.makedirs(out)`, `Path(p).mkdir()`
    inside a function training needs): the rank that comes second finds it made by another rank of this job and goes
    on, as the notebook did alone. A folder that was there before the job still raises FileExistsError."""
    if NBDDP_WORLD_SIZE == 1 or getattr(os.mkdir, "_nbddp_once", False):
        return
    mkdir, exist_ok = os.mkdir, (os.makedirs.__code__, pathlib.Path.mkdir.__code__)

    def once_mkdir(path, *args, **kwargs):
        key = NBDDP_MADE_KEY.format(os.path.realpath(os.fsdecode(path)))
        store = nbddp_store()
        try:
            mkdir(path, *args, **kwargs)
        except FileExistsError:
            caller = sys._getframe(1)  # os.makedirs or Path.mkdir with exist_ok=True: a folder there is no error
            if caller.f_code in exist_ok and caller.f_locals.get("exist_ok"):
                raise
            if _nbddp_done_by_another(store, key) is None:
                raise
            return
        if store is not None:
            store.set(key, str(NBDDP_RANK))

    once_mkdir._nbddp_once = True
    os.mkdir = once_mkdir  # os.makedirs and pathlib make their folders through it


NBDDP_AT_START.append(nbddp_folders_once)
NBDDP_MOVED_KEY = "nbddp/moved/{}"  # a path a rank of this job moved away -> where to (its real path)


def nbddp_moves_once():
    """A file the notebook moves or renames in code every rank runs (`shutil.move(raw, "data/train.csv")` inside a
    function training needs, in the working folder): the rank that comes second finds it moved by another rank of this
    job to the same place and goes on, as the notebook did alone; also into a folder (`shutil.move(src, "data/")`).
    A path that was not there still raises FileNotFoundError."""
    if NBDDP_WORLD_SIZE > 1 and not getattr(os.rename, "_nbddp_once", False):
        os.rename, os.replace = _nbddp_once_move(os.rename), _nbddp_once_move(os.replace)  # shutil.move's too
        shutil.move = _nbddp_once_into_folder(shutil.move)


def _nbddp_once_into_folder(move):
    """shutil.move into a folder: the second rank finds the file there and raises before any rename."""
    def once(src, dst, *args, **kwargs):
        try:
            return move(src, dst, *args, **kwargs)
        except shutil.Error:
            source = os.fsdecode(src)
            into = os.path.join(os.fsdecode(dst), os.path.basename(source.rstrip(os.sep)))
            if os.path.lexists(source) or not os.path.isdir(dst) or _nbddp_done_by_another(
                    nbddp_store(), NBDDP_MOVED_KEY.format(os.path.realpath(source))) != os.path.realpath(into):
                raise
            return into

    return once


def _nbddp_once_move(move):
    def once(src, dst, *args, **kwargs):
        key, where, store = NBDDP_MOVED_KEY.format(os.path.realpath(src)), os.path.realpath(dst), nbddp_store()
        try:
            move(src, dst, *args, **kwargs)
        except FileNotFoundError:
            if not os.path.realpath(src).startswith(os.path.join(os.path.realpath(os.getcwd()), "")):
                raise  # the notebook's own files only (a library's cache handles its own races)
            if _nbddp_done_by_another(store, key) != where:
                raise
            return
        if store is not None:
            store.set(key, where)

    once._nbddp_once = True
    return once


NBDDP_AT_START.append(nbddp_moves_once)
