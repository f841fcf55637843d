"""Every name the session takes from nbddp's launcher (nbddp.launch, nbddp.executor), in one place."""
import os
import sys

from .. import launch
from ..executor import LOG_PREFIX, JobOutput, RankFailedError, rank_log, resolve_nproc, sweep_log_dirs
from ..executor.processes import JobProcesses, send, start_torchrun

__all__ = ["LOG_PREFIX", "JobOutput", "JobProcesses", "RankFailedError", "rank_log", "resolve_nproc", "send",
           "session_launch", "start_torchrun", "sweep_log_dirs"]


def session_launch(nproc, *, all_ranks=False, log_dir=None) -> launch.Launch:
    """The workers' launch, by the recipe every nbddp launch follows: torchrun running `-m nbddp.cellwise.worker` on
    `nproc` processes, rank 0 on the console (every rank with all_ranks), the kernel's interpreter and cores."""
    return launch.build("nbddp.cellwise.worker", nproc, python=sys.executable, cpus=launch.cpu_count(), env=os.environ,
                        flags=["-m"], all_ranks=all_ranks, log_dir=log_dir)
