"""`nbddp` on the command line. Heavy imports happen inside the commands, so `nbddp --help` stays quick."""
from __future__ import annotations

import argparse
import sys

from . import __version__
from .errors import NbddpError

DEFAULT_SCRIPT = "train_ddp.py"


def _convert(args) -> int:
    from .pipeline import convert_notebook
    from .transforms.base import Options
    from .writer import write_script

    to_stdout = args.output == "-"
    script_name = DEFAULT_SCRIPT if to_stdout else args.output
    result = convert_notebook(args.notebook, script_name=script_name, nproc=args.nproc,
                              options=Options(keep_global_batch=args.keep_global_batch))
    if to_stdout:
        sys.stdout.write(result.script)
        print(result.report.format(result.launch), file=sys.stderr)
        return 0
    write_script(args.output, result.script, force=args.force)
    print(result.report.format(result.launch))
    print(f"Wrote {args.output}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="nbddp", description="Turn a fine-tuning notebook into a multi-GPU DDP script, and launch it.")
    parser.add_argument("--version", action="version", version=f"nbddp {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    convert = sub.add_parser("convert", help="write a DDP script from a notebook",
                             description="Write a torchrun-ready DDP script from a notebook and print how to launch it.")
    convert.add_argument("notebook", help="the .ipynb file")
    convert.add_argument("-o", "--output", default=DEFAULT_SCRIPT,
                         help=f"script to write (default: {DEFAULT_SCRIPT}; '-' writes to stdout)")
    convert.add_argument("--force", action="store_true", help="replace an existing file that nbddp did not write")
    convert.add_argument("--nproc", type=int, default=2, help="processes (GPUs) in the printed commands (default: 2)")
    convert.add_argument("--keep-global-batch", action="store_true",
                         help="divide gradient_accumulation_steps by the number of processes when it divides evenly")
    convert.set_defaults(func=_convert)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except NbddpError as exc:
        print(f"nbddp: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("nbddp: interrupted", file=sys.stderr)
        return 130
