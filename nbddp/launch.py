"""Launch commands, built by pure functions (no GPU, no processes) so they are easy to test."""
from __future__ import annotations

import shlex
import sys

MULTI_NODE_FLAGS = ("--nnodes", "--rdzv-endpoint", "--rdzv_endpoint", "--master-addr", "--master_addr",
                    "--node-rank", "--node_rank", "--rdzv-backend", "--rdzv_backend")


def is_multi_node(torchrun_args) -> bool:
    return any(arg.split("=", 1)[0] in MULTI_NODE_FLAGS for arg in torchrun_args)


def torchrun_args(nproc, extra=()) -> list[str]:
    """torchrun's own flags: one process per GPU; --standalone unless the user set up a rendezvous."""
    args = [] if is_multi_node(extra) else ["--standalone"]
    return args + [f"--nproc_per_node={nproc}", *extra]


def torchrun_argv(script, nproc=2, extra=(), script_args=(), python=None) -> list[str]:
    """The argv that runs `script` under torchrun with the current interpreter (`python -m torch.distributed.run`)."""
    return [python or sys.executable, "-m", "torch.distributed.run", *torchrun_args(nproc, extra), str(script),
            *map(str, script_args)]


def torchrun_command(script, nproc=2, extra=(), script_args=()) -> str:
    """What a user types, or pastes into a Kaggle Script's "Command" field."""
    return shlex.join(["torchrun", *torchrun_args(nproc, extra), str(script), *map(str, script_args)])


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


# ---- output routing and flag handling for `%%torchrun` and `nbddp run` ----

#: torchrun's line prefix for --all-ranks (torchrun substitutes ${rank}, the global rank).
RANK_PREFIX_TEMPLATE = "[rank ${rank}] "

#: torchrun flags that take no value (all others take one).
TORCHRUN_SWITCHES = ("--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
                     "--virtual-local-rank", "--virtual_local_rank")
ROUTING_FLAGS = ("--tee", "-t", "--redirects", "-r", "--local-ranks-filter", "--local_ranks_filter")
LOG_DIR_FLAGS = ("--log-dir", "--log_dir")
NPROC_FLAGS = ("--nproc-per-node", "--nproc_per_node")


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def flag_value(torchrun_args, names):
    """The value of the last of `names` in `torchrun_args` (`--flag=value` or `--flag value`), else None."""
    value = None
    args = list(torchrun_args)
    for i, arg in enumerate(args):
        if _flag_name(arg) in names:
            if "=" in arg:
                value = arg.split("=", 1)[1]
            elif i + 1 < len(args):
                value = args[i + 1]
    return value


def has_flag(torchrun_args, names) -> bool:
    return any(_flag_name(arg) in names for arg in torchrun_args)


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


def output_args(nproc: int, all_ranks: bool = False, log_dir=None, torchrun_args=()) -> list[str]:
    """torchrun flags that route the ranks' output, unless the user routes it with torchrun's own flags.

    Local rank 0 always writes straight to the console (carriage-return progress bars pass through untouched).
    Default: the other local ranks write to files under the log dir (`--redirects 1:3,2:3,...`), read back when one
    fails. all_ranks: torchrun also tails the other ranks' files to the console (`--tee 1:3,2:3,...`), each of
    their lines prefixed by torchrun (see RANK_PREFIX_TEMPLATE), so rank 0's bars stay whole."""
    args = []
    if log_dir is not None and not has_flag(torchrun_args, LOG_DIR_FLAGS):
        args += ["--log-dir", str(log_dir)]
    if has_flag(torchrun_args, ROUTING_FLAGS):
        return args
    if int(nproc) > 1:
        args += ["--tee" if all_ranks else "--redirects", ",".join(f"{rank}:3" for rank in range(1, int(nproc)))]
    return args
