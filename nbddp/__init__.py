"""nbddp: turn a fine-tuning notebook into a multi-GPU DistributedDataParallel job, and launch it."""

__version__ = "0.1.0"


def convert(notebook, **kwargs) -> str:
    """Convert a notebook (path, JSON text, dict or NotebookNode) and return the DDP script's text."""
    from .pipeline import convert as _convert

    return _convert(notebook, **kwargs)


def load_ipython_extension(ipython):
    """`%load_ext nbddp`: registers the %%torchrun magic and the %ddp session magics."""
    from .magic import TorchrunMagics
    from .cellwise.magics import register

    ipython.register_magics(TorchrunMagics)
    register(ipython)
