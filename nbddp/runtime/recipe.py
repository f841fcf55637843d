"""How nbddp starts a job: one pure function that returns the torchrun argv and what the launch sets in the
environment. `nbddp run`, `%%torchrun`, `%torchrun`, their dry runs and `nbddp command` take their command from it
(through nbddp/launch.py), and a script that starts itself (runtime/launcher.py) carries it inlined. Standard
library only, no I/O: the caller gives the interpreter, the core count (nbddp_cpu_count reads it) and the
environment.

torchrun's flags below are written with `-` (`--log_dir` is `--log-dir`): a rendezvous of several machines (then no
--standalone), output routing, the log folder."""
import os

NBDDP_MULTI_NODE_FLAGS = ("--nnodes", "--rdzv-endpoint", "--master-addr", "--node-rank", "--rdzv-backend")
NBDDP_ROUTING_FLAGS, NBDDP_LOG_DIR_FLAGS = ("--tee", "-t", "--redirects", "-r", "--local-ranks-filter"), ("--log-dir",)
NBDDP_RANK_PREFIX = "[rank ${rank}] "  # torchrun's line prefix for --all-ranks (it puts in the global rank)


def nbddp_has_flag(flags, names):
    return any(arg.split("=", 1)[0].replace("_", "-") in names for arg in flags)


def nbddp_launch_env(env, nproc, cpus, all_ranks=False):
    """What a launch sets on top of `env`: unbuffered output; NVLink multicast off, the cores shared out as
    OMP_NUM_THREADS (torchrun would set 1 and print a banner) and one string hash on every rank (PYTHONHASHSEED=0)
    where `env` does not set them; with all_ranks, the rank prefix and NBDDP_ALL_RANKS (every rank's logging and
    progress bars too: group.nbddp_start)."""
    ours = {"NCCL_NVLS_ENABLE": "0", "OMP_NUM_THREADS": str(max(1, cpus // max(1, nproc))), "PYTHONHASHSEED": "0"}
    prefix = {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": NBDDP_RANK_PREFIX, "NBDDP_ALL_RANKS": "1"} if all_ranks else {}
    return {"PYTHONUNBUFFERED": "1", **{name: ours[name] for name in ours if name not in env}, **prefix}


def nbddp_launch(script, nproc, *, python, cpus, env, flags=(), script_args=(), all_ranks=False, log_dir=None,
                 routed=True):
    """(argv, environment additions) that run `script` as `nproc` processes per machine under torchrun (`python -m
    torch.distributed.run`; standalone unless the user's torchrun `flags`, passed through, set up a rendezvous).
    Routed: local rank 0 writes to the console (progress bars untouched), the other local ranks to files under the
    log folder (`--redirects`), or with all_ranks to the console as well, each line prefixed (`--tee`); the user's
    own routing flags or log folder win. Unrouted: every rank on the console."""
    flags = list(flags)
    args = ([] if nbddp_has_flag(flags, NBDDP_MULTI_NODE_FLAGS) else ["--standalone"]) + [f"--nproc_per_node={nproc}"]
    if log_dir is not None and not nbddp_has_flag(flags, NBDDP_LOG_DIR_FLAGS):
        args += ["--log-dir", str(log_dir)]
    if routed and nproc > 1 and not nbddp_has_flag(flags, NBDDP_ROUTING_FLAGS):
        args += ["--tee" if all_ranks else "--redirects", ",".join(f"{rank}:3" for rank in range(1, nproc))]
    argv = [python, "-m", "torch.distributed.run", *args, *flags, str(script), *map(str, script_args)]
    return argv, nbddp_launch_env(env, nproc, cpus, all_ranks)


def nbddp_cpu_count():
    """The cores this process may run on: what nbddp_launch shares out."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
