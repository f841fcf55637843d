"""Every name the session takes from nbddp's launcher (nbddp.launch, nbddp.executor), in one place."""
import os
import sys

from .. import launch
from ..executor import FLUSH_EVERY, RankFailedError, rank_log, resolve_nproc
from ..executor.processes import alive, send, start_torchrun

__all__ = ["FLUSH_EVERY", "RankFailedError", "alive", "rank_log", "resolve_nproc", "send", "session_launch", "start_torchrun"]


def session_launch(nproc, *, all_ranks=False, log_dir=None) -> launch.Launch:
    """The workers' launch, by the recipe every nbddp launch follows: torchrun running `-m nbddp.cellwise.worker` on
    `nproc` processes, rank 0 on the console (every rank with all_ranks), the kernel's interpreter and cores."""
    return launch.build("nbddp.cellwise.worker", nproc, python=sys.executable, cpus=launch.cpu_count(), env=os.environ,
                        flags=["-m"], all_ranks=all_ranks, log_dir=log_dir)
