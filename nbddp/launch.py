"""Launch commands, built by pure functions (no GPU, no processes) so they are easy to test."""
from __future__ import annotations

import shlex
import sys

MULTI_NODE_FLAGS = ("--nnodes", "--rdzv-endpoint", "--rdzv_endpoint", "--master-addr", "--master_addr",
                    "--node-rank", "--node_rank", "--rdzv-backend", "--rdzv_backend")


def _is_multi_node(torchrun_args) -> bool:
    return any(arg.split("=", 1)[0] in MULTI_NODE_FLAGS for arg in torchrun_args)


def torchrun_args(nproc, extra=()) -> list[str]:
    """torchrun's own flags: one process per GPU; --standalone unless the user set up a rendezvous."""
    args = [] if _is_multi_node(extra) else ["--standalone"]
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
    command = torchrun_command(script, nproc)
    return [
        command,
        f'Kaggle Script "Command" field: {command}',
        f"or with accelerate: {accelerate_command(script, nproc)}",
    ]
