"""Rank facts from torchrun's environment, this rank's device, and the process group."""
import os
import sys

import torch
import torch.distributed

NBDDP_RANK = int(os.environ.get("RANK", "0"))
NBDDP_LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
NBDDP_WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "1"))
NBDDP_IS_MAIN = NBDDP_RANK == 0  # saving, pushing, generation and prints: once per job
NBDDP_IS_LOCAL_MAIN = NBDDP_LOCAL_RANK == 0  # files and caches: once per machine
NBDDP_DEVICE = f"cuda:{NBDDP_LOCAL_RANK}" if torch.cuda.is_available() else "cpu"


def nbddp_start():
    """Make plain "cuda" mean this rank's GPU, and say how the job runs."""
    if torch.cuda.is_available():
        torch.cuda.set_device(NBDDP_LOCAL_RANK)
    elif NBDDP_WORLD_SIZE > 1:
        # Without it, Hugging Face's Trainer on a machine without GPUs ignores torchrun: every rank trains alone.
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")
    if NBDDP_IS_MAIN and NBDDP_WORLD_SIZE > 1:
        print(f"nbddp: {NBDDP_WORLD_SIZE} processes, this one is rank 0 on {NBDDP_DEVICE}", flush=True)


def nbddp_device_map():
    """The whole model on this rank's own device."""
    return {"": NBDDP_DEVICE}


def nbddp_dist():
    """True when running distributed. The process group starts at first use, after the notebook's own imports."""
    if NBDDP_WORLD_SIZE == 1 or not torch.distributed.is_available():
        return False
    if not torch.distributed.is_initialized():
        if torch.cuda.is_available():
            torch.distributed.init_process_group("nccl", device_id=torch.device(NBDDP_DEVICE))
        else:
            torch.distributed.init_process_group("gloo")
    return True


def nbddp_barrier():
    """Wait until every rank gets here."""
    if nbddp_dist():
        if torch.distributed.get_backend() == "nccl":
            torch.distributed.barrier(device_ids=[NBDDP_LOCAL_RANK])
        else:
            torch.distributed.barrier()


def nbddp_teardown():
    """Wait for every rank, then close the process group; a rank that failed skips the wait."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if sys.exc_info()[0] is None:
            nbddp_barrier()
        torch.distributed.destroy_process_group()
