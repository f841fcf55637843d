"""The host transport of the sharded mode (nbddp/runtime/shard.py, `transport="host"`, every rank on one machine):
each rank writes its slice of every block once into a file in shared memory (/dev/shm, or the temporary folder where
/dev/shm is small), every rank maps the other ranks' files and pins them for the copy engines, and a gather is a
copy from there into the block's buffer beside a device copy of its own slice. The frozen bytes never change, so
nothing crosses between processes per step; the files are unlinked once mapped. It is the sharded mode's choice where
the machine's free memory holds one copy of the frozen layers with room to spare (nbddp_host_transport), else the
gathers are all-gathers."""
import os
import shutil
import tempfile

import torch
import torch.distributed


NBDDP_HOST_SPARE = (1.25, 2 * 2 ** 30)  # the machine keeps a quarter more than the frozen layers, and 2 GiB, free


def nbddp_host_available():
    """Bytes of memory the machine can still give (Linux's MemAvailable), or None where it cannot tell."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            return next((int(line.split()[1]) * 1024 for line in fh if line.startswith("MemAvailable:")), None)
    except (OSError, ValueError):
        return None


def nbddp_host_transport(frozen, one_machine, available):
    """(transport, why): "host" where every rank is on one machine whose free memory holds one copy of the `frozen`
    bytes with room to spare, else "collective" and why (for the load's line)."""
    if not one_machine:
        return "collective", "the ranks are on several machines"
    if available is not None and available < frozen * NBDDP_HOST_SPARE[0] + NBDDP_HOST_SPARE[1]:
        return "collective", f"the machine has {available / 2 ** 30:.1f} GiB of memory free, one copy of the frozen " \
                             f"layers takes {frozen / 2 ** 30:.1f}"
    return "host", None


def _nbddp_shared_dir():
    """/dev/shm where it has room (a container may give it 64 MB), else the temporary folder."""
    try:
        if shutil.disk_usage("/dev/shm").free > 2 ** 32:
            return "/dev/shm"
    except OSError:
        pass
    return tempfile.gettempdir()


def _nbddp_pin(tensor):
    """Page-lock a CPU tensor's memory for the GPU's copy engines (cudaHostRegister); False where it fails."""
    try:
        rc = torch.cuda.cudart().cudaHostRegister(tensor.data_ptr(), tensor.numel() * tensor.element_size(), 0)
    except Exception:  # noqa: BLE001 (no CUDA runtime bindings: copies still work, from pageable memory)
        return False
    return int(rc) == 0 if not isinstance(rc, tuple) else int(rc[0]) == 0


def nbddp_host_prefix(group=None):
    """The files' common prefix, the group's first rank's (one name for every rank)."""
    where = [_nbddp_shared_dir() + f"/nbddp-shard-{os.getpid()}"]
    torch.distributed.broadcast_object_list(where, src=torch.distributed.get_global_rank(group, 0)
                                            if group is not None else 0, group=group)
    return where[0]


def nbddp_host_write(path, shard):
    """This rank's slice of a block, written once where the other ranks will map it; returns the path."""
    torch.from_file(path, shared=True, size=shard.numel(), dtype=torch.uint8).copy_(shard)
    return path


def nbddp_host_map(shards):
    """After the last block: every rank maps the others' slices (pinned, for copies that do not wait for the host)
    and unlinks its own files (the mappings keep them)."""
    torch.distributed.barrier(group=shards.group)
    for block in shards.blocks:
        n = block.shard.numel()
        block.host = [None if r == shards.rank else torch.from_file(
            f"{shards.host_prefix}-{block.index}-{r}", shared=True, size=n, dtype=torch.uint8)
            for r in range(shards.world)]
        if block.shard.is_cuda:
            shards.pinned += [src for src in block.host if src is not None and _nbddp_pin(src)]
    torch.distributed.barrier(group=shards.group)
    for path in shards.host_files:
        os.unlink(path)
    shards.host_files = []


def nbddp_host_copy(block, out):
    """A gather by copies: each rank's slice into its place in `out` (this rank's from its own device copy)."""
    n = block.shard.numel()
    for r, src in enumerate(block.host):
        out[r * n:(r + 1) * n].copy_(block.shard if src is None else src, non_blocking=True)
