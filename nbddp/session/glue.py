"""Every name the session takes from nbddp's launcher (nbddp.launch, nbddp.executor), in one place."""
from ..executor import RankFailedError, child_env, resolve_nproc
from ..launch import torchrun_argv

__all__ = ["RankFailedError", "child_env", "resolve_nproc", "torchrun_argv"]
