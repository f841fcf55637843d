"""Running a torchrun job from a notebook kernel or a shell, one module per job:

- `job`: the job planned by the launch recipe (nbddp.launch), run with its output streamed live, stopped whole on
  interrupt; its log folder swept;
- `failures`: torchrun's report read, its noise held back, the failed rank's error (`RankFailedError`) with its
  frames as cell lines;
- `output`: torchrun's output streamed: decoded, its noise held back, a few writes a second;
- `processes`: torchrun and its ranks as a process tree (psutil), liveness, dying with the kernel.

Shared by the `%%torchrun` magic (nbddp.torchrun_magic), `nbddp run` (nbddp.cli) and the `%ddp` session
(nbddp.cellwise); the names below are the API.
"""
from .failures import (LauncherNoise, RankFailedError, all_failures, cell_frames, job_failure, last_traceback,
                       parse_failure, rank_log)
from .job import GRACE, LOG_PREFIX, TorchrunJob, log_dir, plan, resolve_nproc, run_argv, run_script, sweep_log_dirs
from .output import FLUSH_EVERY, JobOutput
from .processes import alive

__all__ = ["FLUSH_EVERY", "GRACE", "JobOutput", "LOG_PREFIX", "LauncherNoise", "RankFailedError", "TorchrunJob",
           "all_failures", "alive", "cell_frames", "job_failure", "last_traceback", "log_dir", "parse_failure", "plan",
           "rank_log", "resolve_nproc", "run_argv", "run_script", "sweep_log_dirs"]
