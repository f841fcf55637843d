"""What IPython gives a notebook, given to a script: the same meaning for the same lines.

- `nbddp_expand(line)`: IPython's expansion of a shell or magic line, from the names of the code that runs it:
  `{expr}` is evaluated, `$name` and `$name.attr` (outside single quotes) are replaced, `$$` stands for `$`; where
  any part cannot be evaluated (`!echo $HOME`: no Python name HOME), the line stays as written, as IPython leaves it.
- `nbddp_env(line)`: `%env` of a line the notebook computes: IPython's reading of it (set `NAME=value` or
  `NAME value`, saying so on rank 0; get `NAME`; all of it for an empty line).
- `nbddp_time()`: `x = %time f()`: the code runs (on every rank, as the notebook ran it once), and rank 0 says how
  long it took.
- `nbddp_capture(...)`: `%%capture [name]`: the cell's output is kept out of the console; `name` holds it
  (`.stdout`, `.stderr`, `.outputs`, `.show()`).
- `nbddp_run_file(line, namespace)`: `%run [-i] [-n] [-e] file args` or `%run -m module args`: the file runs in
  this process as `__main__` (sys.argv the line's words), then its names are the notebook's; `-i` runs it among the
  notebook's names, `-n` not as `__main__`; a `sys.exit` ends the file, not the notebook, and keeps what it bound
  (an exit code other than 0 is said, unless `-e`). Where nbddp.ran_files says: on every rank where the notebook
  needs its names or it sets up the process or trains (a script of several processes runs as this job's ranks),
  else on rank 0.
- `nbddp_show(value)`: a cell's last expression, shown on rank 0 as Jupyter shows it (its text form), unless None.
- `display` and `get_ipython`, which IPython provides as builtins: `display(...)` shows text on rank 0;
  `get_ipython()` is None, as in any process without IPython (a notebook's `'google.colab' in str(get_ipython())`
  reads False).
"""
import contextlib
import io
import os
import runpy
import shlex
import string
import sys
import time
import types

from .group import NBDDP_IS_MAIN


def _nbddp_dollars(text):
    """(literal, name) pieces of `text` for each `$name` outside single quotes; `$$name` is the literal `$name`.
    The last piece has no name."""
    pieces, literal, i, quoted = [], "", 0, False
    while i < len(text):
        char = text[i]
        if char == "$" and not quoted:
            double = text[i + 1:i + 2] == "$"
            end = i + 1 + double
            while end < len(text) and (text[end].isalnum() or text[end] in "_."):
                end += 1
            if end > i + 1 + double:
                if double:
                    literal += text[i + 1:end]
                else:
                    pieces.append((literal, text[i + 1:end]))
                    literal = ""
                i = end
                continue
        quoted = quoted != (char == "'")
        literal += char
        i += 1
    return pieces + [(literal, None)]


def _nbddp_expanded(line, namespace):
    out = []
    for literal, field, spec, conversion in string.Formatter().parse(line):
        for text, name in _nbddp_dollars(literal):
            out.append(text)
            if name is not None:
                out.append(format(eval(name, namespace), ""))
        if field is not None:
            value = eval(field + (":" + spec if spec else ""), namespace)
            value = repr(value) if conversion == "r" else ascii(value) if conversion == "a" else value
            out.append(format(value, ""))
    return "".join(out)


def nbddp_expand(line):
    """`line` as IPython expands a shell or magic line, from the caller's names; unchanged where that fails."""
    frame = sys._getframe(1)
    try:
        return _nbddp_expanded(line, {**frame.f_globals, **frame.f_locals})
    except Exception:
        return line


def nbddp_env(line):
    """`%env line`, as IPython reads it (the environment is every rank's own: every rank runs it)."""
    name, sep, value = line.strip().partition("=" if "=" in line else " ")
    if not name:
        return dict(os.environ)
    if not sep:
        return os.environ[name]
    os.environ[name.strip()] = value.strip()
    if NBDDP_IS_MAIN:
        print(f"env: {name.strip()}={value.strip()}", flush=True)
    return None


@contextlib.contextmanager
def nbddp_time():
    """`%time` of a value: the block runs, rank 0 says how long it took."""
    start, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        if NBDDP_IS_MAIN:
            print(f"CPU times: total: {time.process_time() - cpu:.3g} s\nWall time: {time.perf_counter() - start:.3g} s",
                  flush=True)


class NbddpCaptured:
    """What `%%capture name` binds: the cell's output; `name.show()` (or `name()`) prints it."""

    def __init__(self):
        self.stdout = self.stderr = ""
        self.outputs = []

    def show(self):
        """On rank 0, as the notebook's `name.show()` shows it once."""
        if NBDDP_IS_MAIN:
            sys.stdout.write(self.stdout)
            sys.stderr.write(self.stderr)
        for value in self.outputs:
            nbddp_display(value)

    __call__ = show


_NBDDP_CAPTURES = []  # the %%capture blocks running now, innermost last (displays go to the innermost)


def _nbddp_exec_file(path, namespace):
    """The file's code in `namespace`, its folder first on sys.path (as IPython runs it); `sys.exit` keeps what the
    file bound so far: the exit, its code."""
    with open(path, encoding="utf-8") as fh:
        code = compile(fh.read(), path, "exec")
    folder = os.path.dirname(os.path.abspath(path))
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        exec(code, namespace)
    except SystemExit as done:
        return done.code
    finally:
        if added:
            with contextlib.suppress(ValueError):  # the file may have taken it out itself
                sys.path.remove(folder)
    return None


def nbddp_run_file(line, namespace):
    words, flags, module = shlex.split(line), "", None
    while words and words[0].startswith("-") and module is None:
        flag = words.pop(0)
        module = words.pop(0) if flag == "-m" and words else None
        flags += "" if module else flag[1:]
    if module is None and not words:
        raise ValueError(f"%run {line}: no file to run")
    path = module or words[0]
    if module is None and not os.path.exists(path) and os.path.exists(path + ".py"):  # `%run prep` runs prep.py
        path += ".py"
    argv, sys.argv = sys.argv, [path, *(words if module else words[1:])]
    name = "__main__" if "n" not in flags else os.path.splitext(os.path.basename(path))[0]
    main, code = types.ModuleType(name), None
    main.__file__, ran = path, vars(main) if "i" not in flags else {}
    kept, sys.modules[name] = sys.modules.get(name), main  # classes the file defines pickle as runpy's would
    try:
        if module is not None:
            try:
                ran = runpy.run_module(module, run_name=name, alter_sys=True)
            except SystemExit as done:
                code = done.code
        else:
            code = _nbddp_exec_file(path, namespace if "i" in flags else ran)
    finally:
        sys.argv = argv
        if kept is not None:
            sys.modules[name] = kept
        else:
            sys.modules.pop(name, None)
    if code not in (None, 0) and "e" not in flags:  # IPython shows it, in short, and the notebook goes on
        print(f"%run {line}: SystemExit: {code}", file=sys.stderr)
    namespace.update({key: value for key, value in ran.items() if not (key.startswith("__") and key.endswith("__"))})


@contextlib.contextmanager
def nbddp_capture(stdout=True, stderr=True, display=True):
    """`%%capture`: the block's prints (and, unless display=False, its displays) are kept, not shown."""
    captured, streams = NbddpCaptured(), (sys.stdout, sys.stderr)
    out, err = io.StringIO(), io.StringIO()
    if stdout:
        sys.stdout = out
    if stderr:
        sys.stderr = err
    if display:
        _NBDDP_CAPTURES.append(captured)
    try:
        yield captured
    finally:
        sys.stdout, sys.stderr = streams
        if display:
            _NBDDP_CAPTURES.remove(captured)
        captured.stdout, captured.stderr = out.getvalue(), err.getvalue()


def _nbddp_text(value):
    """The text Jupyter shows for a value: IPython's pretty form (its repr where IPython is absent); for a rich
    object with no text form of its own (IPython.display.Markdown, HTML, ...), its markdown, LaTeX or HTML source.
    Importing IPython sets the recursion limit (to 3000); the notebook's own limit, set in a kernel that had IPython
    already, stays."""
    limit = sys.getrecursionlimit()
    try:
        from IPython.lib.pretty import pretty
    except ImportError:
        pretty = repr
    finally:
        sys.setrecursionlimit(limit)
    text = pretty(value)
    rich = (getattr(value, name, lambda: None)() for name in ("_repr_markdown_", "_repr_latex_", "_repr_html_"))
    return next((source for source in rich if isinstance(source, str)), text) if text.endswith("object>") else text


NBDDP_OUT = {}  # IPython's Out (and _oh): execution count -> the value a cell showed


def nbddp_show(value, count=None):
    """A cell's last expression: its text on rank 0, unless None (the value itself is computed on every rank). With
    `count` (the cell's execution count, where the notebook reads IPython's output history), every rank keeps the
    value as IPython does: Out[count], _count, and _ (the value), __ and ___ (the two before)."""
    if value is None:
        return
    nbddp_display(value)
    if count is not None:
        names = sys._getframe(1).f_globals  # the notebook's namespace: the script's globals, a %ddp session's
        NBDDP_OUT[count] = names[f"_{count}"] = value
        names["___"], names["__"], names["_"] = names.get("__", ""), names.get("_", ""), value


NBDDP_INPUTS = []  # (the cell as written, its Python as IPython runs it), in execution order


def nbddp_history(inputs):
    """IPython's history names for a notebook that reads them, as a new kernel has them before its first cell: In
    and _ih [""], Out and _oh (filled as cells show values: nbddp_show) empty, _, __, ___, _i, _ii, _iii "".
    `inputs`: each code cell as (written, as IPython runs it), in order; nbddp_cell_input adds each as its cell starts."""
    NBDDP_INPUTS[:] = inputs
    names = sys._getframe(1).f_globals
    ran = [""]
    names.update(In=ran, _ih=ran, Out=NBDDP_OUT, _oh=NBDDP_OUT, _="", __="", ___="", _i="", _ii="", _iii="")


def nbddp_cell_input(count):
    """Cell `count` starts, as IPython stores its input: In[count], _i<count> (the cell as written), and _i, _ii,
    _iii the three cells before it."""
    names = sys._getframe(1).f_globals
    written, python = NBDDP_INPUTS[count - 1]
    names["In"].append(python)
    names["_iii"], names["_ii"], names["_i"] = names["_ii"], names["_i"], names.get(f"_i{count - 1}", "")
    names[f"_i{count}"] = written


def nbddp_display(*values, **kwargs):
    """IPython's display() in a script: each value's text on rank 0 (inside %%capture: kept in its outputs); with
    display_id, a handle whose update() shows the new value."""
    for value in values:
        if _NBDDP_CAPTURES:
            _NBDDP_CAPTURES[-1].outputs.append(value)
        elif NBDDP_IS_MAIN:
            print(_nbddp_text(value), flush=True)
    return types.SimpleNamespace(update=nbddp_display, display=nbddp_display) if kwargs.get("display_id") else None


def nbddp_no_ipython():
    """get_ipython() in a process without IPython."""
    return None


# IPython's builtins, for a notebook that reads them without an import (the script keeps these lines only then)
display = nbddp_display
get_ipython = nbddp_no_ipython
