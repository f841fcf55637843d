"""`nbddp` on the command line. Heavy imports happen inside the commands, so `nbddp --help` stays quick."""
from __future__ import annotations

import argparse
import sys

from .errors import NbddpError
from .version import __version__

DEFAULT_SCRIPT = "train_ddp.py"


def _convert(args) -> int:
    from .pipeline import convert_notebook
    from .transforms.base import Options
    from .writer import write_conversion

    to_stdout = args.output == "-"
    script_name = DEFAULT_SCRIPT if to_stdout else args.output
    result = convert_notebook(args.notebook, script_name=script_name, nproc=args.nproc,
                              options=Options(scale_batch=args.scale_batch), single_file=to_stdout or args.single_file)
    if to_stdout:
        sys.stdout.write(result.script)
        _say(result.report.format(result.launch), sys.stderr)
        return 0
    written = write_conversion(args.output, result, force=args.force, source=args.notebook)
    _say(result.report.format(result.launch), sys.stdout)
    _say(_wrote(written), sys.stdout)
    return 0


def _wrote(written) -> str:
    if len(written) == 1:
        return f"Wrote {written[0]}"
    return f"Wrote {written[0]} and {written[1]} (nbddp's runtime, which the script imports: keep them together)"


def _say(text: str, stream):
    """One message for a person: control characters a cell may hold (ANSI, OSC) shown escaped on a terminal, and
    names that are not UTF-8 shown with backslashes, never a UnicodeEncodeError."""
    if stream.isatty():
        text = "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text)
    encoding = getattr(stream, "encoding", None) or "utf-8"
    print(text.encode(encoding, "backslashreplace").decode(encoding), file=stream)


def _count(value: str, auto: bool = False):
    """argparse type of --nproc: a whole number, 1 or more (or 'auto' where `auto`); else a usage error, exit 2."""
    from .launch import parse_nproc

    if auto and value.strip().lower() == "auto":
        return "auto"
    try:
        return parse_nproc(value)
    except NbddpError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _count_or_auto(value: str):
    return _count(value, auto=True)


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
    convert.add_argument("--nproc", type=_count, default=2,
                         help="processes (GPUs) in the printed commands (default: 2)")
    convert.add_argument("--scale-batch", action="store_true",
                         help="train N times the notebook's samples per optimizer step on N processes (the default "
                              "keeps the notebook's batch where N divides gradient_accumulation_steps)")
    convert.add_argument("--single-file", action="store_true",
                         help="one self-contained script, nbddp's runtime inlined (a Kaggle Script upload); by "
                              "default the script imports it from a file written beside it")
    convert.add_argument("--keep-global-batch", action="store_true", help=argparse.SUPPRESS)  # the default now
    convert.set_defaults(func=_convert)

    run = sub.add_parser(
        "run", help="convert a notebook (or take a script) and launch it with torchrun",
        usage="nbddp run NOTEBOOK_OR_SCRIPT [--nproc N] [--out PATH] [--force] [--all-ranks] [--dry-run] "
              "[torchrun flags ...] [-- script args ...]",
        description="Launch a DDP job with torchrun: a .ipynb is converted first (like `nbddp convert`), a .py runs "
                    "as it is. Rank 0's output streams to the terminal; a failed rank ends the command with its exit "
                    "code. Other torchrun flags pass through (--nnodes, --rdzv-endpoint, --node-rank, ...: then "
                    "there is no --standalone); arguments after `--` go to the script.")
    run.add_argument("target", metavar="NOTEBOOK_OR_SCRIPT", help="a .ipynb to convert and run, or a .py to run")
    run.add_argument("--nproc", type=_count_or_auto, default="auto",
                     help="processes per node: a number, or 'auto' (one per visible GPU, 2 on CPU; the default)")
    run.add_argument("-o", "--out", default=None, metavar="PATH",
                     help=f"script written from a notebook (default: {DEFAULT_SCRIPT})")
    run.add_argument("--force", action="store_true", help="replace a file at --out that nbddp did not write")
    run.add_argument("--all-ranks", action="store_true",
                     help="show every rank's output, each line prefixed [rank N] (default: rank 0's only)")
    run.add_argument("--dry-run", action="store_true", help="write the script and print the command; launch nothing")
    run.set_defaults(func=_run, passthrough=True)

    command = sub.add_parser(
        "command", help="print the launch command, e.g. for a Kaggle Script's \"Command\" field",
        usage="nbddp command [SCRIPT] [--nproc N] [torchrun flags ...] [-- script args ...]",
        description="Print the torchrun command line that launches SCRIPT: paste it into a Kaggle Script's "
                    "\"Command\" field, or run it in a terminal.")
    command.add_argument("script", nargs="?", default=DEFAULT_SCRIPT,
                         help=f"the script to launch (default: {DEFAULT_SCRIPT})")
    command.add_argument("--nproc", type=_count, default=2, help="processes (GPUs) per node (default: 2)")
    command.set_defaults(func=_command, passthrough=True)
    return parser


def _own_options(parser) -> set:
    options = set()
    for action in parser._actions:
        options.update(action.option_strings)
        for sub in getattr(action, "choices", None) or {}:
            if isinstance(action.choices, dict):
                options |= _own_options(action.choices[sub])
    return options


def _parse(parser, argv):
    """argparse for convert; for run and command, unknown flags are torchrun's and `--` starts the script's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("run", "command"):
        return parser.parse_args(argv)
    head, tail = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    from .launch import glue_values

    args, extra = parser.parse_known_args(glue_values(head, _own_options(parser)))
    stray = [tok for tok in extra if not tok.startswith("-")]
    if stray:
        parser.error(f"unexpected argument {stray[0]!r} (torchrun flags go as --flag=value; "
                     "script arguments after --)")
    args.torchrun_flags, args.script_args = extra, tail
    return args


def _run(args) -> int:
    import os

    from . import executor
    from .launch import check_flags, command_line

    check_flags(args.torchrun_flags)
    target = args.target
    kind = target.lower().rsplit(".", 1)[-1] if "." in target else ""
    if kind not in ("ipynb", "py"):
        raise NbddpError(f"{target}: expected a notebook (.ipynb) or a Python script (.py)")
    if kind == "py" and args.out:
        raise NbddpError("--out is for notebooks; a .py script runs as it is")
    if not os.path.isfile(target):
        raise NbddpError(f"{target}: no such file")
    nproc = executor.resolve_nproc(args.nproc)
    script = target
    if kind == "ipynb":
        from .pipeline import convert_notebook
        from .writer import write_conversion

        script = args.out or DEFAULT_SCRIPT
        from .transforms.base import Options

        result = convert_notebook(target, script_name=script, nproc=nproc, single_file=False,
                                  options=Options(main_prints=not args.all_ranks))  # --all-ranks: every rank prints
        written = write_conversion(script, result, force=args.force, source=target)
        _say(result.report.format(), sys.stderr)
        _say(_wrote(written), sys.stderr)
    how = dict(extra=args.torchrun_flags, script_args=args.script_args, all_ranks=args.all_ranks)
    if args.dry_run:
        print(command_line(executor.plan(script, nproc, **how)))
        return 0
    try:
        executor.run_script(script, nproc, **how)
    except executor.RankFailedError as exc:
        if exc.traceback:
            print(f"rank {exc.rank} traceback (last lines):", file=sys.stderr)
            print("\n".join("    " + line for line in exc.traceback.splitlines()), file=sys.stderr)
        print(f"nbddp: error: {exc}", file=sys.stderr)
        return exc.exit_status()
    return 0


def _command(args) -> int:
    from .launch import torchrun_command

    if args.script.endswith(".ipynb"):
        raise NbddpError(f"{args.script} is a notebook; convert it first (nbddp convert {args.script} -o "
                         f"{DEFAULT_SCRIPT}), then give the script")
    print(torchrun_command(args.script, args.nproc, extra=args.torchrun_flags, script_args=args.script_args))
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    try:
        return args.func(args)
    except NbddpError as exc:
        _say(f"nbddp: error: {exc}", sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("nbddp: interrupted", file=sys.stderr)
        return 130
