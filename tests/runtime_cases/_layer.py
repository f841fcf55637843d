"""Load the whole runtime exactly as a generated script carries it (nbddp/runtime/ inlined by nbddp.inline), and
start it as the script does, but for the process group: the cases start and end their own groups."""
import os
import sys
import time
import types


def _rendered():
    """nbddp.inline's rendering of the whole runtime, kept in the temp folder under a digest of nbddp's files (and
    libcst's version): rendered (libcst parses every runtime module, over a second) once per version of the sources,
    not in every rank of every case. The text is render's own, byte for byte."""
    import hashlib
    import importlib.metadata
    import importlib.util
    import tempfile

    root = os.path.dirname(importlib.util.find_spec("nbddp").origin)
    digest = hashlib.sha256(importlib.metadata.version("libcst").encode())
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for file in sorted(f for f in files if not f.endswith(".pyc")):
            path = os.path.join(folder, file)
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as fh:
                digest.update(fh.read() + b"\0")
    cached = os.path.join(tempfile.gettempdir(), f"nbddp-test-layer-{digest.hexdigest()[:24]}.py")
    try:
        with open(cached, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        pass
    from nbddp.inline import everything, render

    code = render(everything())
    partial = f"{cached}.{os.getpid()}"
    with open(partial, "w", encoding="utf-8") as fh:
        fh.write(code)
    os.replace(partial, cached)  # whole or absent, whichever rank of which case renders it first
    for name in os.listdir(os.path.dirname(cached)):  # other versions' renderings, once a day old
        old = os.path.join(os.path.dirname(cached), name)
        try:
            if name.startswith("nbddp-test-layer-") and time.time() - os.path.getmtime(old) > 86400:
                os.remove(old)
        except OSError:
            pass
    return code


def load_layer(name="nbddp_layer"):
    code = _rendered()
    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    exec(compile(code + "\nnbddp_start(group=False)\n", module.__file__, "exec"), module.__dict__)
    return module


def finish():
    """End a case as a generated script ends (every rank waits, then the group closes), then leave at once.

    Python's own exit would free the DDP reducers, whose gloo process group joins its worker threads while this
    thread holds the GIL; a worker still freeing a finished work item's Python tensors needs the GIL, so now and then
    a rank hung there or aborted ("terminate called without an active exception"). Nothing of a case's result is
    lost: it has printed and written everything by now."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
