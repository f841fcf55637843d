"""nbddp: turn a fine-tuning notebook into a multi-GPU DistributedDataParallel job, and launch it."""

from .version import __version__

__all__ = ["__version__", "convert", "load_ipython_extension"]


def convert(notebook, **kwargs) -> str:
    """Convert a notebook (path, JSON text, dict or NotebookNode) and return the DDP script's text."""
    from .pipeline import convert as _convert

    return _convert(notebook, **kwargs)


def load_ipython_extension(ipython):
    """`%load_ext nbddp`: registers the %%torchrun magic and the %ddp session magics."""
    from .cellwise.ddp_magics import register
    from .torchrun_magic import TorchrunMagics

    ipython.register_magics(TorchrunMagics)
    register(ipython)
