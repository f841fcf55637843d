"""`python train_ddp.py` on a machine with several GPUs trains on all of them: the script becomes torch's own
launcher (torch.distributed.run, standalone, the same Python and arguments), which runs it as one process per GPU;
Ctrl-C and SIGTERM reach that launcher, which stops every rank, and its exit status is the script's. Rank 0 writes
to the console, the other ranks to torchrun's log files; the launch is nbddp's one recipe (runtime/recipe.py), as
`nbddp run` and `%%torchrun` start theirs. NBDDP_NPROC=N sets the count (1: one process). Under torchrun,
accelerate, `nbddp run` or `%%torchrun` the script is already one of the job's processes."""
import os
import sys

import torch

from .recipe import nbddp_cpu_count, nbddp_launch

NBDDP_LAUNCHED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "ACCELERATE_USE_CPU")


def nbddp_usage_error(text):
    """One line, exit status 2, before anything loads."""
    print(f"nbddp: error: {text}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def nbddp_nproc():
    """NBDDP_NPROC, else the number of GPUs torch sees (0 without any); NBDDP_MODE is checked on the way."""
    value, mode = os.environ.get("NBDDP_NPROC", "").strip(), os.environ.get("NBDDP_MODE", "auto").strip().lower()
    if mode not in ("", "auto", "ddp", "shard", "split"):
        nbddp_usage_error(f"NBDDP_MODE={mode!r}: use ddp, shard, split or auto")
    if not value:
        return torch.cuda.device_count()
    if not value.isdigit() or int(value) < 1:
        nbddp_usage_error(f"NBDDP_NPROC={value!r}: give the number of processes, 1 or more")
    return int(value)


def nbddp_self_launch(nproc, mode="ddp"):
    """Become torchrun running this script as `nproc` processes in the mode decided (DDP, or "shard": the ranks'
    NBDDP_MODE): torch's own launcher (torch.distributed.run's main) in this process, which has torch imported
    already; the script's status is the job's. Where this process holds a CUDA context (the GPUs' free memory read
    through CUDA), it is replaced by a fresh torchrun instead, which leaves the GPUs' memory to the ranks."""
    print(f"nbddp: {torch.cuda.device_count()} GPUs: running as {nproc} processes (NBDDP_NPROC=1 for one)", flush=True)
    argv, env = nbddp_launch(sys.argv[0], nproc, python=sys.executable, cpus=nbddp_cpu_count(), env=os.environ,
                             script_args=sys.argv[1:])
    os.environ.update(env, NBDDP_MODE=mode)
    if torch.cuda.is_initialized():
        os.execv(argv[0], argv)
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    status = 0
    try:
        main(argv[argv.index("torch.distributed.run") + 1:])
    except ChildFailedError as exc:
        print(exc, file=sys.stderr)  # torchrun's account: which rank failed first, how, where its output is
        status = 1
    except SignalException as exc:  # stopped (Ctrl-C, SIGTERM): torchrun has stopped the ranks
        status = 128 + int(exc.sigval)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # as a torchrun started in its place would: nothing of the script runs after the job


def nbddp_say_missing(failure):
    """A package the notebook imports is not installed: one line naming the install commands of the script's header
    (the notebook's own, removed from the script) that mention it, once per machine."""
    if os.environ.get("LOCAL_RANK", "0") != "0" or not getattr(failure, "name", None):
        return
    package = failure.name.split(".")[0].lower().replace("_", "-")  # pip's names: `unsloth-zoo` for unsloth_zoo
    header = getattr(sys.modules.get("__main__"), "__doc__", None) or ""
    listed = header.split("Install first", 1)[1].splitlines()[1:] if "Install first" in header else []
    commands = [line.strip() for line in listed if line.startswith("    ") and package in line.lower().replace("_", "-")]
    hint = f"run {' and '.join(commands)}" if commands else \
        "install it (the script's header lists the notebook's install commands)" if listed else "install it"
    print(f"nbddp: the notebook imports {failure.name}, which is not installed here: {hint}, then run the script "
          "again", file=sys.stderr, flush=True)
