"""What a launch is, built by pure functions (no torch, no processes, no I/O) so they are easy to test.

The recipe itself, argv and environment together, is nbddp/runtime/recipe.py (standard library only, so that a
generated script carries it inlined and starts itself by the same rule); this module adds what the command line and
the magic need around it: the process count checked, the command shown by a dry run, torchrun's flags read."""
from __future__ import annotations

import shlex
from typing import NamedTuple

from .errors import LaunchError
from .runtime.recipe import (NBDDP_LOG_DIR_FLAGS as LOG_DIR_FLAGS, NBDDP_MULTI_NODE_FLAGS as MULTI_NODE_FLAGS,
                             NBDDP_RANK_PREFIX as RANK_PREFIX_TEMPLATE, nbddp_cpu_count as cpu_count,
                             nbddp_has_flag as has_flag, nbddp_launch, nbddp_launch_env as launch_env)

__all__ = ["LOG_DIR_FLAGS", "MULTI_NODE_FLAGS", "RANK_PREFIX_TEMPLATE", "Launch", "build", "check_flags",
           "command_line", "cpu_count", "flag_value", "glue_values", "has_flag", "launch_env", "launch_lines",
           "parse_nproc", "torchrun_command"]

#: torchrun flags that take no value (all others take one).
TORCHRUN_SWITCHES = ("--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
                     "--virtual-local-rank", "--virtual_local_rank")
NPROC_FLAGS = ("--nproc-per-node",)


class Launch(NamedTuple):
    """A launch: the argv to run, and what it sets in the environment on top of the caller's."""
    argv: list
    env: dict


def parse_nproc(value, device_count=None) -> int:
    """The process count: a whole number, 1 or more; or 'auto' where `device_count` (a function: the GPUs there
    are) is given: one process per GPU, 2 on a machine without any."""
    text = str(value).strip().lower()
    if text == "auto" and device_count is not None:
        return device_count() or 2
    try:
        count = int(text)
    except ValueError:
        allowed = "a whole number or 'auto'" if device_count is not None else "a whole number"
        raise LaunchError(f"the process count must be {allowed}, not {value!r}") from None
    if count < 1:
        raise LaunchError(f"the process count must be at least 1, not {count}")
    return count


def check_flags(flags) -> None:
    """The process count is nbddp's own argument: torchrun's --nproc-per-node in the passed-through flags is an
    error (nbddp routes each rank's output by it)."""
    if has_flag(flags, NPROC_FLAGS):
        raise LaunchError("give the process count as N (`%%torchrun N`, `nbddp run --nproc N`), not as torchrun's "
                          "--nproc-per-node")


def build(script, nproc, *, python, cpus, env, flags=(), script_args=(), all_ranks=False, log_dir=None,
          routed=True) -> Launch:
    """The launch (argv, environment additions) of `script` on `nproc` processes per machine: the recipe
    (runtime/recipe.py), after the flags are checked."""
    check_flags(flags)
    return Launch(*nbddp_launch(script, nproc, python=python, cpus=cpus, env=env, flags=flags,
                                script_args=script_args, all_ranks=all_ranks, log_dir=log_dir, routed=routed))


def command_line(launch: Launch) -> str:
    """A launch as one shell line, what a dry run prints: the variables it sets, then its argv."""
    return " ".join([f"{name}={shlex.quote(value)}" for name, value in launch.env.items()] + [shlex.join(launch.argv)])


def is_multi_node(flags) -> bool:
    return has_flag(flags, MULTI_NODE_FLAGS)


def torchrun_command(script, nproc=2, extra=(), script_args=()) -> str:
    """What a user types, or pastes into a Kaggle Script's "Command" field: the recipe's argv with the `torchrun`
    command for `python -m torch.distributed.run`, unrouted (that console shows what torchrun shows); the
    environment is that machine's."""
    job = build(script, nproc, python="python", cpus=1, env={}, flags=extra, script_args=script_args, routed=False)
    return shlex.join(["torchrun", *job.argv[3:]])


def accelerate_command(script, nproc=2) -> str:
    return shlex.join(["accelerate", "launch", "--multi_gpu", f"--num_processes={nproc}", str(script)])


def launch_lines(script, nproc=2) -> list[str]:
    """How to start a converted script: as it is (it starts one process per GPU itself), or under a launcher."""
    return [
        f"python {shlex.quote(str(script))}   (a Kaggle Script as it is: one process per GPU, started by the script; "
        "NBDDP_NPROC=1: one)",
        f"{torchrun_command(script, nproc)}   (a Kaggle Script's \"Command\" field, or several machines)",
        accelerate_command(script, nproc),
    ]


# ---- torchrun's flags among the magic's and the command line's own ----

def flag_value(torchrun_args, names):
    """The value of the last of `names` in `torchrun_args` (`--flag=value` or `--flag value`), else None."""
    value = None
    args = list(torchrun_args)
    for i, arg in enumerate(args):
        if has_flag([arg], names):
            if "=" in arg:
                value = arg.split("=", 1)[1]
            elif i + 1 < len(args):
                value = args[i + 1]
    return value


def glue_values(tokens, own_options=()):
    """Write `--flag value` as `--flag=value` for torchrun flags that take a value, so that an argparse parser which
    does not know them cannot take the value for one of its own positional arguments. `own_options` (the parser's
    own flags) and torchrun's switches are left as they are."""
    out, tokens, i = [], list(tokens), 0
    while i < len(tokens):
        tok = tokens[i]
        if (tok.startswith("-") and tok not in ("-", "--") and "=" not in tok and tok not in own_options
                and tok not in TORCHRUN_SWITCHES and i + 1 < len(tokens) and not tokens[i + 1].startswith("-")):
            out.append(f"{tok}={tokens[i + 1]}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out
