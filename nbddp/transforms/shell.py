"""Classifying shell commands from `!cmd`, `%pip` and `%%bash` cells: installs are dropped, the rest run once."""
from __future__ import annotations

import shlex

import libcst as cst

PACKAGE_TOOLS = frozenset({"pip", "pip3", "conda", "mamba", "micromamba", "apt", "apt-get", "yum", "dnf", "brew"})
PYTHONS = frozenset({"python", "python3", "py"})


def _words(command: str) -> list[str]:
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return []
    while words and ("=" in words[0] and not words[0].startswith("-") or words[0] in {"sudo", "env", "!"}):
        words = words[1:]  # leading VAR=value assignments, sudo, env
    return words


def is_install(command: str) -> bool:
    """True for package-manager commands: pip, uv pip, python -m pip, conda, apt and friends."""
    words = _words(command)
    if not words:
        return False
    tool = words[0].rsplit("/", 1)[-1]
    if tool in PACKAGE_TOOLS or tool.startswith("pip"):
        return True
    if tool == "uv" and len(words) > 1 and words[1] in {"pip", "add", "sync"}:
        return True
    # `!{sys.executable} -m pip …`: IPython puts the notebook's own interpreter there
    python = tool in PYTHONS or tool.startswith("python3.") or tool.strip("{}").endswith("executable")
    if python and words[1:3] == ["-m", "pip"]:
        return True
    return False


LAUNCH_MODULES = frozenset({"torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch"})


def is_launch(command: str) -> bool:
    """A command that starts a distributed job: torchrun, `python -m torch.distributed.run`, `accelerate launch`,
    deepspeed."""
    words = _words(command)
    tool = words[0].rsplit("/", 1)[-1] if words else ""
    python = tool in PYTHONS or tool.startswith("python3.") or tool.strip("{}").endswith("executable")
    return tool in ("torchrun", "deepspeed") or (tool == "accelerate" and words[1:2] == ["launch"]) or (
        python and len(words) > 2 and words[1] == "-m" and words[2] in LAUNCH_MODULES)


def launch_inside(shown: str) -> str:
    """What the conversion says where the notebook starts a distributed job (`!torchrun ...`, or through subprocess)."""
    return f"`{shown}` starts a distributed job of its own inside this one; drop the line and convert the notebook " \
           "that trains (or run that script by itself: nbddp launches it)"


def runs_python(command: str) -> bool:
    """A command that runs a Python program (`python train.py`, `python -m pkg`, `!{sys.executable} script.py`):
    not an install, not a launch of a distributed job."""
    words = _words(command)
    tool = words[0].rsplit("/", 1)[-1] if words else ""
    python = tool in PYTHONS or tool.startswith("python3.") or tool.strip("{}").endswith("executable")
    return python and len(words) > 1 and not is_install(command) and not is_launch(command)


OWN_PROCESS = ("runs a Python program: it starts in one process of its own, outside this job (without the job's rank "
               "variables), as in the notebook")


def script_lines(script: str) -> list[str]:
    """The logical lines of a shell script: backslash continuations joined, blanks dropped."""
    lines, pending = [], ""
    for raw in script.splitlines():
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        line = (pending + raw).strip()
        pending = ""
        if line:
            lines.append(line)
    if pending.strip():
        lines.append(pending.strip())
    return lines


def install_lines(script: str) -> list[str]:
    return [line for line in script_lines(script) if is_install(line)]


def one_line(text: str, limit: int = 100) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def program_command(call: cst.Call, names) -> str | None:
    """The command line a call that starts a program is given (`subprocess.run(["torchrun", "train.py"])`,
    `os.system("pip install x")`): its literal words (an f-string's text with `x` for each value, `python` for
    `sys.executable`), joined. A value the converter cannot read is `x` once the program and what it runs are read
    (the program; for Python, its script, `-m` module or `-c` code: the first word that is not an option), else the
    command is None."""
    value = call.args[0].value if call.args else None
    nodes = [e.value for e in value.elements] if isinstance(value, (cst.List, cst.Tuple)) else \
        [value] if value is not None else []
    words, program_read = [], False
    for node in nodes:
        if isinstance(node, cst.FormattedString):
            words.append("".join(p.value if isinstance(p, cst.FormattedStringText) else "x" for p in node.parts))
            continue
        text = names.literal(node)
        word = text if isinstance(text, str) else "python" if names.meanings(node) == {"sys.executable"} else None
        program_read = program_read or (not words and word is not None)
        if word is None and not (program_read and _target_read(words)):
            return None
        words.append("x" if word is None else word)
    return " ".join(words) if words else None


def _target_read(words: list[str]) -> bool:
    """What the program runs is among these words (the program read): a program other than Python, or Python with a
    word after it that is not an option."""
    tool = words[0].rsplit("/", 1)[-1]
    python = tool in PYTHONS or tool.startswith("python3.")
    return not python or any(not word.startswith("-") for word in words[1:])


def may_install(call: cst.Call, names) -> bool:
    """The program a call starts is a package manager's install (`pip install x`), or one the converter cannot read:
    what it does stays every rank's (each machine needs the packages)."""
    command = program_command(call, names)
    return command is None or is_install(command)
