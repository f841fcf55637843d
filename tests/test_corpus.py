"""Every corpus notebook converts into a script that parses and keeps the DDP rules, and converting twice is a no-op.

The checks walk the script's AST (not the text): rank-0-only calls under a rank test, model loads on the rank's
own device, no IPython left, no transformers/trl/peft import before the notebook's own `import unsloth`.
"""
from __future__ import annotations

import ast

import nbformat
import pytest

from conftest import CORPUS_NOTEBOOKS, corpus_ids, need_corpus

MAIN_ONLY_PREFIXES = ("save_pretrained", "push_to_hub", "save_lora", "save_model")
MAIN_ONLY_NAMES = {"generate", "fast_generate"}
RANK_NAMES = {"NBDDP_IS_MAIN", "NBDDP_RANK", "rank", "local_rank", "is_main_process", "is_world_process_zero",
              "get_rank", "RANK", "LOCAL_RANK", "process_index", "is_local_main_process", "should_save"}
LATE_LIBRARIES = ("transformers", "trl", "peft")
# This check's own notion of a model load, written apart from nbddp's placement step (so that it catches a loader the
# step misses): every `X.from_pretrained(...)` but what puts no model on a device (tokenizers, processors, configs),
# PEFT's adapters for a model already loaded, and loaders without a device_map (the notebook moves the model itself).
NOT_A_MODEL = ("Tokenizer", "TokenizerFast", "Processor", "Config", "FeatureExtractor")
NO_DEVICE_MAP = {"PeftModel", "SNAC"}  # SNAC: Orpheus' audio codec, `.to("cuda")` after loading
# Work every rank must do together: under a rank-0 guard it would hang the job.
COLLECTIVE = {"train", "evaluate", "from_pretrained", "get_peft_model", "load_dataset", "nbddp_barrier",
              "barrier", "all_reduce", "broadcast", "nbddp_main_process_first"}


def _tail(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def loads_a_model(call: ast.Call) -> bool:
    func = call.func
    if not isinstance(func, ast.Attribute) or func.attr != "from_pretrained":
        return False
    owner = func.value.attr if isinstance(func.value, ast.Attribute) else getattr(func.value, "id", "")
    return not owner.endswith(NOT_A_MODEL) and owner not in NO_DEVICE_MAP


def _is_if_false(node) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Constant) and node.test.value in (False, 0)


def _is_rank_test(node) -> bool:
    return isinstance(node, ast.If) and bool({n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
                                             | {n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute)}
                                             & RANK_NAMES)


def live_calls(node, guarded=False, ours=False):
    """(call, guarded, ours) for each call in code that runs (not in def/class/lambda bodies, not under `if False:`);
    guarded: under any rank test; ours: under the `if NBDDP_IS_MAIN:` nbddp wrote."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
        return
    if isinstance(node, ast.If):
        yield from live_calls(node.test, guarded, ours)
        if not _is_if_false(node):
            mine = isinstance(node.test, ast.Name) and node.test.id == "NBDDP_IS_MAIN"
            for child in node.body:
                yield from live_calls(child, guarded or _is_rank_test(node), ours or mine)
        for child in node.orelse:
            yield from live_calls(child, guarded, ours)
        return
    if isinstance(node, ast.Call):
        yield node, guarded, ours
    for child in ast.iter_child_nodes(node):
        yield from live_calls(child, guarded, ours)


def notebook_body(tree: ast.Module) -> ast.Try:
    """The `try: <cells> finally: nbddp_teardown()` that holds the notebook's code."""
    tries = [n for n in tree.body if isinstance(n, ast.Try) and any(
        isinstance(c, ast.Call) and _tail(c) == "nbddp_teardown" for s in n.finalbody for c in ast.walk(s))]
    assert len(tries) == 1, "the script has no single `try: ... finally: nbddp_teardown()` around the notebook"
    return tries[0]


def split_at_rest(statements):
    """(the statements every rank runs, those after `nbddp_rest_on_rank0()` that rank 0 runs alone)."""
    for i, stmt in enumerate(statements):
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and _tail(stmt.value) == "nbddp_rest_on_rank0":
            return statements[:i], statements[i + 1:]
    return statements, []


def imports_in_order(node):
    """Top-level module names imported, in the order the script runs them (def bodies skipped)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
        return
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name.split(".")[0], node.lineno
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        yield node.module.split(".")[0], node.lineno
    for child in ast.iter_child_nodes(node):
        yield from imports_in_order(child)


def _binds(node) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.alias):
            out.add((n.asname or n.name).split(".")[0])
    return out


def _live_reads(node) -> set[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)) or _is_if_false(node):
        return set()
    found = {node.id} if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) else set()
    for child in ast.iter_child_nodes(node):
        found |= _live_reads(child)
    return found


def _is_our_guard(stmt) -> bool:
    return isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Name) and stmt.test.id == "NBDDP_IS_MAIN"


def rank0_only_reads(statements, rank0_only: set[str], problems: list[str]):
    """Names bound only under `if NBDDP_IS_MAIN:` do not exist on the other ranks: nothing unguarded may read them."""
    for stmt in statements:
        if _is_our_guard(stmt):
            rank0_only |= _binds(stmt)
            continue
        if any(_is_our_guard(n) for n in ast.walk(stmt) if n is not stmt):  # guards inside: look at each block
            for block in ("body", "orelse", "finalbody"):
                rank0_only_reads(getattr(stmt, block, None) or [], rank0_only, problems)
            for handler in getattr(stmt, "handlers", []):
                rank0_only_reads(handler.body, rank0_only, problems)
            continue
        used = _live_reads(stmt) & rank0_only
        if used:
            problems.append(f"line {stmt.lineno}: reads {sorted(used)}, which only rank 0 has")
        rank0_only -= _binds(stmt)


def ddp_rule_problems(script: str, code_cells: list[int], loader_warnings: bool = False) -> list[str]:
    """What breaks the DDP rules in a generated script; `code_cells`: the notebook positions of its code cells."""
    tree = ast.parse(script)  # the whole script parses
    problems = []
    if "get_ipython" in script or any(isinstance(n, ast.Name) and n.id == "get_ipython" for n in ast.walk(tree)):
        problems.append("get_ipython is left in the script")

    body = notebook_body(tree)
    before, alone = split_at_rest(body.body)  # after training's end rank 0 runs the rest alone: as if guarded
    calls = [c for stmt in before for c in live_calls(stmt)] + [
        (call, True, True) for stmt in alone for call, _, _ in live_calls(stmt)]
    for call, guarded, ours in calls:
        tail = _tail(call)
        if ours and (tail in COLLECTIVE or tail.endswith("Trainer")):
            problems.append(f"line {call.lineno}: {ast.unparse(call.func)}(...) every rank must run is under "
                            "`if NBDDP_IS_MAIN:` (the job would hang)")
        if (tail.startswith(MAIN_ONLY_PREFIXES) or tail in MAIN_ONLY_NAMES) and not guarded:
            problems.append(f"line {call.lineno}: {ast.unparse(call.func)}(...) runs on every rank")
        if loads_a_model(call):
            device_map = next((k.value for k in call.keywords if k.arg == "device_map"), None)
            ours = isinstance(device_map, ast.Call) and _tail(device_map) == "nbddp_device_map"
            if not ours and not loader_warnings:
                problems.append(f"line {call.lineno}: {ast.unparse(call.func)} without device_map=nbddp_device_map()")

    rank0_only_reads(before, set(), problems)
    for node in ast.walk(body):  # rank 0 runs a main-process-first block alone: no collective work inside
        if isinstance(node, ast.With) and any(isinstance(i.context_expr, ast.Call)
                                              and _tail(i.context_expr) == "nbddp_main_process_first" for i in node.items):
            for call, _, _ in (c for stmt in node.body for c in live_calls(stmt)):
                if _tail(call) in COLLECTIVE - {"load_dataset"} or _tail(call).endswith("Trainer"):
                    problems.append(f"line {call.lineno}: {ast.unparse(call.func)}(...) inside main-process-first")
    for node in ast.walk(body):  # a function that trains (every rank calls it) may wait inside; others may not
        calls = [_tail(c) for c in ast.walk(node) if isinstance(c, ast.Call)] if isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else []
        if {"nbddp_barrier", "nbddp_main_process_first"} & set(calls) and not (
                set(calls) & (COLLECTIVE - {"nbddp_barrier", "nbddp_main_process_first"})):
            problems.append(f"line {node.lineno}: a barrier inside a function (it may run on some ranks only)")

    # Unsloth patches transformers/trl/peft when it is imported first: nothing may import them earlier.
    order = [name for stmt in tree.body for name, _ in imports_in_order(stmt)]
    if "unsloth" in order:
        early = set(order[: order.index("unsloth")]) & set(LATE_LIBRARIES)
        if early:
            problems.append(f"{sorted(early)} imported before the notebook's first `import unsloth`")

    lines = set(script.splitlines())
    problems += [f"no `# %% cell {n}` marker" for n in code_cells if f"    # %% cell {n}" not in lines]
    # editors (VS Code, Jupytext) start a cell at each "# %%" line: only nbddp's own markers may look like that
    problems += [f"stray cell marker {line.strip()!r}" for line in sorted(lines)
                 if line.lstrip().startswith("# %%") and not line.lstrip()[len("# %% cell "):].isdigit()]
    return problems


@pytest.mark.parametrize("path", CORPUS_NOTEBOOKS, ids=corpus_ids())
def test_corpus_notebook_converts_and_keeps_the_ddp_rules(path, converted):
    result = converted(path)
    nb = nbformat.read(path, as_version=4)
    code_cells = [n for n, c in enumerate(nb.cells, start=1) if c.cell_type == "code" and c.source.strip()]
    # A loader nbddp could not rewrite (device_map from a variable, **kwargs) must at least be in the report.
    loader_warnings = any("from_pretrained" in note.text for note in result.report.warnings)
    problems = ddp_rule_problems(result.script, code_cells, loader_warnings)
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("path", CORPUS_NOTEBOOKS, ids=corpus_ids())
def test_corpus_script_defines_every_runtime_name_it_uses(path, converted):
    """The runtime is cut to what the script reads (nbddp.inline): no nbddp name may be left undefined."""
    from pyflakes import api, reporter

    class Collect(reporter.Reporter):
        def __init__(self):
            self.messages = []

        def flake(self, message):
            self.messages.append(str(message))

        def syntaxError(self, *args):
            self.messages.append(f"syntax error {args}")

    collected = Collect()
    api.check(converted(path).script, "train_ddp.py", collected)
    undefined = [m for m in collected.messages if "syntax error" in m or ("undefined name" in m and any(
        f"'{prefix}" in m for prefix in ("nbddp", "NBDDP", "_nbddp", "_NBDDP", "Nbddp", "_Nbddp")))]
    assert not undefined, undefined


BAD_SCRIPT = """\
import transformers
try:
    # %% cell 1
    # %%capture
    from unsloth import FastLanguageModel
    model, tok = FastLanguageModel.from_pretrained("m")
    codec = MyCodecModel.from_pretrained("c")  # a loader nbddp's placement step does not know
    tok = AutoTokenizer.from_pretrained("m")
    if False:
        model.save_pretrained("dead")  # dead code is fine
    def later():
        model.push_to_hub("x")  # only when called: fine
    if NBDDP_IS_MAIN:
        model.save_pretrained("ok")
    out = model.generate(x)
    get_ipython().system("ls")
    if NBDDP_IS_MAIN:
        trainer.train()
        text = tok.decode(out[0])
    print(text)
    def save():
        nbddp_barrier()
    with nbddp_main_process_first():
        trainer = SFTTrainer(model, train_dataset=load_dataset("x"))
finally:
    nbddp_teardown()
"""


def test_the_rule_checker_catches_each_broken_rule():
    problems = ddp_rule_problems(BAD_SCRIPT, code_cells=[1, 3])
    text = "\n".join(problems)
    assert "get_ipython" in text
    assert "model.generate(...) runs on every rank" in text
    assert "save_pretrained" not in text and "push_to_hub" not in text
    assert "FastLanguageModel.from_pretrained without device_map" in text
    assert "MyCodecModel.from_pretrained without device_map" in text and "AutoTokenizer" not in text
    assert "['transformers'] imported before" in text
    assert "no `# %% cell 3` marker" in text and "cell 1`" not in text
    assert "trainer.train(...) every rank must run is under `if NBDDP_IS_MAIN:`" in text
    assert "a barrier inside a function" in text
    assert "reads ['text'], which only rank 0 has" in text
    assert "stray cell marker '# %%capture'" in text
    assert "SFTTrainer(...) inside main-process-first" in text
    assert len(problems) == 11, problems


def test_the_corpus_is_there():
    need_corpus()
    assert len(CORPUS_NOTEBOOKS) >= 30, "the shared corpus of Unsloth notebooks is missing or incomplete"


@pytest.mark.parametrize("path", CORPUS_NOTEBOOKS, ids=corpus_ids())
def test_converting_twice_changes_nothing_more(path, converted):
    """Feed the converted cells back in as a notebook (same layout, markdown kept): the second pass is a no-op."""
    from nbddp.cells import cell_number
    from nbddp.notebook import as_notebook
    from nbddp.pipeline import run_pipeline
    from nbddp.report import Report
    from nbddp.transforms.base import Context

    first = converted(path).cells
    again = as_notebook(str(path))
    for cell in again.cells:
        if cell.cell_type == "code":
            cell.source = ""
    for cell in first:
        again.cells[cell_number(cell) - 1].source = cell.source
    ctx = Context(report=Report(source=path.name))
    second = run_pipeline(again, ctx)
    before = {cell_number(c): c.source for c in first}
    after = {cell_number(c): c.source for c in second.cells}
    changed = [n for n in before if before[n] != after.get(n)]
    assert before and not changed, f"{path.name}: a second conversion changed cell(s) {changed}:\n" + "\n".join(
        f"--- cell {n} first:\n{before[n]}\n--- second:\n{after.get(n)}" for n in changed[:2])
    assert not ctx.report.warnings, f"second pass warned: {ctx.report.warnings}"


def test_without_the_corpus_a_clone_skips_and_ci_fails(monkeypatch):
    import conftest

    monkeypatch.setattr(conftest, "CORPUS_NOTEBOOKS", [])
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="corpus is not at"):
        conftest.need_corpus()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI has it"):
        conftest.need_corpus()
