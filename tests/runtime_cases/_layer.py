"""Load the whole runtime exactly as a generated script carries it (nbddp/runtime/ inlined by nbddp.inline), and
start it as the script does, but for the process group: the cases start and end their own groups."""
import os
import sys
import types


def load_layer(name="nbddp_layer"):
    from nbddp.inline import everything, render

    code = render(everything())
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
