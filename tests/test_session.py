"""`%ddp 2` in a real Jupyter kernel (ipykernel driven by jupyter_client), on CPU with 2 gloo ranks: the example
notebook run cell by cell on both ranks, then what a user does between and after (a collective read in the next
cell, failing cells, an interrupt during training, a killed kernel). One kernel and one session for all of it; the
tests below check what it recorded. The training is compared with the same notebook converted by `nbddp convert`
and run by torchrun (conftest.py's example_ddp_job, shared with test_e2e_ddp.py).
"""
from __future__ import annotations

import os
import queue
import re
import sys
import time

import nbformat
import pytest

from e2e import child_env
from test_kernel import Kernel, streamed
from nbddp.executor import alive as _alive, sweep_log_dirs
from tinymodels import EXAMPLE_NOTEBOOK

pytestmark = pytest.mark.ddp

FAKE_UNSLOTH = ("import torch.distributed as dist\n"
                "GROUP_DURING_IMPORT = dist.is_initialized()\n")
COUNT_SAVES = ("saves = []\n"
               "_save = model.save_pretrained\n"
               "model.save_pretrained = lambda *args, **kwargs: (saves.append(1), _save(*args, **kwargs))[1]\n")
COUNTS = ("import torch.distributed as dist\n"
          "from IPython.display import HTML, display\n"
          "counts = torch.tensor([float(len(saves)), float('outputs' in globals())])\n"
          "dist.all_reduce(counts)\n"
          "handle = display(HTML(f'<b>{type(model).__name__}</b>'), display_id=True)\n"
          "handle.update(HTML('<i>updated</i>'))\n"
          "counts.tolist()\n")
NEXT = "print('read in the next cell:', counts.tolist(), 'world', dist.get_world_size())\n"
LOOP = "for item in ('a', 'b'):\n    talk.call(item)\n"  # another library's calls alone: rank 0's
AFTER_LOOP = "seen = [None, None]\ndist.all_gather_object(seen, item)\nprint('after the loop', seen)\n"
REGISTER = "import dsreg\ndsreg.register('mine', [1.0, 2.0])\n"  # another library's call alone: rank 0's, until
LOAD = ("rows = dsreg.load('mine')\nloaded = [None, None]\n"  # a later cell makes a value of that library
        "dist.all_gather_object(loaded, sum(rows))\nprint('loaded', loaded)\n")
FAIL_EVERYWHERE = "x = 1\nraise ValueError('boom on every rank')\n"
FAIL_ON_ONE = ("import os\nif os.environ['RANK'] == '1':\n    raise KeyError('missing-key')\n"
               "print('rank 0 waits at the barrier after this print')\n")
LONG_TRAINING = "trainer.args.max_steps = 100000\ntrainer.train()\n"
AFTER_INTERRUPT = ("steps = torch.tensor([float(trainer.state.global_step)])\n"
                   "dist.all_reduce(steps)\n"
                   "print('steps agree:', steps.item() == 2 * trainer.state.global_step, trainer.state.global_step)\n")

FORMS = ("total = %time sum(range(10))\nfolder = 'f'\nlisted = !echo $folder-{total}\ndisplay(listed.s)\n"
         "'google.colab' in str(get_ipython())\n")
DEATH = "import os, time\nif os.environ['RANK'] == '1':\n    os._exit(3)\ntime.sleep(60)\n"


def _errors(messages):
    return [m["content"] for m in messages if m["msg_type"] == "error"]


def _shown(messages):
    return streamed(messages) + "".join("\n".join(e["traceback"]) for e in _errors(messages))


def _displays(messages):
    return [m["content"]["data"] for m in messages if m["msg_type"] in ("display_data", "execute_result")]


def _pids(ran):
    """torchrun's and the ranks' process ids, as `%ddp` tells them."""
    return [int(pid) for pid in re.findall(r"pid (\d+)", streamed(ran[1]))]


def _interrupt_when(kernel, code, seen_text, timeout=240):
    """Run `code`, interrupt the kernel once `seen_text` was streamed; the cell's status and messages."""
    msg_id = kernel.kc.execute(code)
    messages, interrupted, deadline = [], False, time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            msg = kernel.kc.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        messages.append(msg)
        if not interrupted and seen_text in streamed(messages):
            kernel.km.interrupt_kernel()
            interrupted = True
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kernel.kc.get_shell_msg(timeout=30)
    return reply["content"]["status"], messages, interrupted


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """Everything one kernel did, by name: (status, messages) per cell, and what the end left."""
    cwd = tmp_path_factory.mktemp("session")
    (cwd / "pkgs" / "unsloth").mkdir(parents=True)
    (cwd / "pkgs" / "unsloth" / "__init__.py").write_text(FAKE_UNSLOTH)
    (cwd / "pkgs" / "talk.py").write_text("import os\n\nCALLS = []\n\n\ndef note():\n"
                                          "    with open('talk.log', 'a') as fh:\n"
                                          "        fh.write(os.environ['RANK'] + '\\n')\n\n\n"
                                          "def call(item):\n    CALLS.append(item)\n"
                                          "    with open('calls.log', 'a') as fh:\n"
                                          "        fh.write(os.environ['RANK'] + '\\n')\n")
    (cwd / "pkgs" / "dsreg.py").write_text("REGISTRY = {}\n\n\ndef register(name, rows):\n    REGISTRY[name] = rows\n\n\n"
                                           "def load(name):\n    return list(REGISTRY[name])\n")
    (cwd / "tmp").mkdir()
    env = {**child_env(cwd), "TMPDIR": str(cwd / "tmp"),
           "PYTHONPATH": os.pathsep.join([str(cwd / "pkgs"), *sys.path])}
    kernel = Kernel(cwd, env=env)
    done = {"cwd": cwd, "cells": []}
    try:
        done["torch in the kernel"] = kernel.run("import torch\nlocal_value = 7\n")
        done["start"] = kernel.run("%ddp 2", timeout=300)
        done["import unsloth"] = kernel.run("import unsloth\nimport torch.distributed as dist\n"
                                            "print('group during', unsloth.GROUP_DURING_IMPORT, 'after', "
                                            "dist.is_initialized())\n")
        nb = nbformat.read(str(EXAMPLE_NOTEBOOK), as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                if cell.source.startswith("model.save_pretrained"):
                    done["count saves"] = kernel.run(COUNT_SAVES)
                done["cells"].append(kernel.run(cell.source))
        kernel.kc.execute_interactive("silent_value = 1", silent=True, timeout=30)  # a front end's own request
        for name, code in (("counts", COUNTS), ("next", NEXT), ("fail everywhere", FAIL_EVERYWHERE),
                           ("fail on one", FAIL_ON_ONE), ("after failure", NEXT), ("forms", FORMS), ("local", "%%local\nlocal_value + silent_value\n"),
                           ("module writes", "import talk\ntalk.note()\n"), ("loop", LOOP), ("after loop", AFTER_LOOP),
                           ("register", REGISTER), ("load", LOAD),
                           ("where", "%ddp")):
            done[name] = kernel.run(code)
        done["interrupt"] = _interrupt_when(kernel, LONG_TRAINING, "'loss'")
        done["after interrupt"] = kernel.run(AFTER_INTERRUPT)
        done["stop"] = kernel.run("%ddp stop")
        done["stopped"] = [pid for pid in _pids(done["where"]) if _alive(pid)]
        done["in the kernel again"] = kernel.run("print(local_value)")
        done["restart"] = kernel.run("%ddp 2 --all-ranks", timeout=300)
        done["all ranks"] = kernel.run("import os\nprint('hello from rank', os.environ['RANK'])\n")
        second = _pids(kernel.run("%ddp"))
        done["death"] = kernel.run(DEATH)
        done["after death"] = [pid for pid in second if _alive(pid)]
        done["third"] = kernel.run("%ddp 2", timeout=300)
        pids = done["pids"] = _pids(kernel.run("%ddp"))
        kernel.km.shutdown_kernel(now=True)  # a forced restart: the kernel is killed, nothing in it runs again
        killed = time.monotonic()
        for key, watched, seconds in (("left", pids[1:], 10), ("torchrun left", pids[:1], 75)):
            while any(_alive(pid) for pid in watched) and time.monotonic() < killed + seconds:
                time.sleep(0.2)
            done[key] = [pid for pid in watched if _alive(pid)]
        done["logs left"] = sorted(p.name for p in (cwd / "tmp").iterdir() if p.name.startswith("nbddp-logs-"))
        sweep_log_dirs(str(cwd / "tmp"))  # what the next job or session of any kernel does first
        done["logs swept"] = sorted(p.name for p in (cwd / "tmp").iterdir() if p.name.startswith("nbddp-logs-"))
    finally:
        if kernel.km.is_alive():
            kernel.close()
    return done


def test_the_session_starts_in_a_kernel_that_imported_torch_and_says_so(session):
    status, messages = session["start"]
    assert session["torch in the kernel"][0] == "ok"
    assert status == "ok" and "nbddp: 2 ranks ready" in streamed(messages), _shown(messages)
    status, messages = session["import unsloth"]  # Unsloth installed: the group waits for its import
    assert status == "ok" and "group during False after True" in streamed(messages), _shown(messages)


def test_the_notebook_runs_cell_by_cell_on_both_ranks(session):
    for status, messages in session["cells"]:
        assert status == "ok", _shown(messages)
    out = "".join(streamed(messages) for _, messages in session["cells"])
    assert "seconds used for training on 2 process(es)." in out, out[-3000:]
    assert out.count("Generated:") == 1 and out.count("Saved the LoRA adapters") == 1, out[-3000:]
    assert "not run on the ranks: pip install transformers" in out  # the install cell: a note, nothing run


def test_one_save_and_one_generation_over_both_ranks_read_by_an_all_reduce_in_the_next_cell(session):
    status, messages = session["counts"]
    assert status == "ok", _shown(messages)
    displays = _displays(messages)
    assert {"text/html": "<b>PeftModelForCausalLM</b>"}.items() <= next(d for d in displays if "text/html" in d).items()
    assert any(d.get("text/plain") == "[1.0, 1.0]" for d in displays), displays  # the cell's last expression
    [update] = [m["content"] for m in messages if m["msg_type"] == "update_display_data"]
    assert update["data"]["text/html"] == "<i>updated</i>" and update["transient"]["display_id"]
    status, messages = session["next"]
    assert status == "ok" and "read in the next cell: [1.0, 1.0] world 2" in streamed(messages), _shown(messages)


def test_the_session_trains_the_weights_that_convert_and_torchrun_train(session, example_ddp_job):
    from safetensors.torch import load_file
    import torch

    assert example_ddp_job.returncode == 0, example_ddp_job.explain()
    ours = load_file(session["cwd"] / "lora_model" / "adapter_model.safetensors")
    reference = load_file(example_ddp_job.cwd / "lora_model" / "adapter_model.safetensors")
    assert ours.keys() == reference.keys() and ours
    for name in ours:
        assert torch.allclose(ours[name], reference[name], rtol=1e-5, atol=1e-7), name


def test_a_file_a_module_writes_on_every_rank_is_written_once(session):
    """Each cell runs on every rank; a module the notebook imports appends a line to a file: one rank writes it
    (the other ranks write their own copy)."""
    assert session["module writes"][0] == "ok", _shown(session["module writes"][1])
    assert (session["cwd"] / "talk.log").read_text() == "0\n"


def test_a_loop_of_another_librarys_calls_runs_on_rank_0_and_every_rank_gets_its_variable(session):
    """A later cell may read the loop's variable: rank 0's is every rank's after the loop, which rank 0 alone ran."""
    assert session["loop"][0] == "ok", _shown(session["loop"][1])
    status, messages = session["after loop"]
    assert status == "ok" and "after the loop ['b', 'b']" in streamed(messages), _shown(messages)
    assert (session["cwd"] / "calls.log").read_text() == "0\n0\n"  # the loop's calls: rank 0's, once each


def test_a_set_up_a_later_cell_needs_runs_then_on_the_other_ranks(session):
    """`dsreg.register(...)` ran on rank 0 alone (later cells unknown); the next cell loads from dsreg on every
    rank: the other ranks run the registration first (before, rank 1's load raised KeyError)."""
    assert session["register"][0] == "ok", _shown(session["register"][1])
    status, messages = session["load"]
    assert status == "ok" and "loaded [3.0, 3.0]" in streamed(messages), _shown(messages)


@pytest.mark.parametrize("first, later, replayed", [
    ("import dsreg\ndsreg.register('mine', [1.0])\n", "rows = dsreg.load('mine')\n",
     "    nbddp_show(dsreg.register('mine', [1.0]))\n"),
    ("from dsreg import register as reg\ndef setup(name):\n    reg(name, [1.0])\nsetup('a')\n",  # a function, an alias
     "import dsreg\nrows = dsreg.load('a')\n", "    setup('a')\n"),
    ("import dsreg\ndsreg.register('txt', \'\'\'one\ntwo\'\'\')\n", "rows = dsreg.load('txt')\n",  # a string of lines:
     "    nbddp_show(dsreg.register('txt', \'\'\'one\ntwo\'\'\'))\n"),  # kept as it is
    ("import dsreg\nfor name in ('a', 'b'):\n    dsreg.register(name, [2.0])\n",  # a loop
     "import dsreg as d\nrows = d.load('b')\n", "    for name in ('a', 'b'):\n        dsreg.register(name, [2.0])\n"),
])
def test_a_later_cell_that_reads_a_librarys_values_replays_its_set_up_on_the_other_ranks(first, later, replayed):
    from nbddp.cellwise.history import History

    history = History()
    for source in ("import torch\nloss = torch.ones(1, requires_grad=True).sum()\nloss.backward()\n", first):
        done = history.convert(source)
        assert "if NBDDP_IS_MAIN:" in done.code or source != first, done.code  # rank 0's: later cells unknown
        history.accept(source, done)
    done = history.convert(later)
    head = "if not NBDDP_IS_MAIN:\n" + replayed
    assert head in done.code and done.code.index(head) < done.code.index("load("), done.code
    history.accept(later, done)
    assert "if not NBDDP_IS_MAIN" not in history.convert(later).code  # once


def test_a_failing_cell_raises_rank_failed_error_and_the_next_cell_runs(session):
    status, messages = session["fail everywhere"]
    [error] = _errors(messages)
    assert status == "error" and error["ename"] == "RankFailedError", _shown(messages)
    assert "ValueError: boom on every rank" in error["evalue"] and "session goes on" in error["evalue"]
    shown_as = next(m["content"]["execution_count"] for m in messages if m["msg_type"] == "execute_input")
    assert f"Cell In[{shown_as}], line 2: raise ValueError('boom on every rank')" in _shown(messages)  # its own In[N]
    status, messages = session["fail on one"]  # rank 0 waits for rank 1 at nbddp's barrier, and is stopped there
    [error] = _errors(messages)
    assert error["ename"] == "RankFailedError" and error["evalue"].startswith("rank 1 raised KeyError: 'missing-key'")
    assert re.search(r"Cell In\[\d+\], line 3: raise KeyError\('missing-key'\)", _shown(messages))
    assert "rank 0 waits at the barrier after this print" in streamed(messages)
    status, messages = session["after failure"]
    assert status == "ok" and "read in the next cell: [1.0, 1.0]" in streamed(messages), _shown(messages)


def test_ipythons_forms_mean_in_the_session_what_they_mean_in_the_kernel(session):
    """A magic used as a value, a shell line that expands, display() and get_ipython() without an import, and the
    cell's last value: shown once, by rank 0, as the kernel's own displays."""
    status, messages = session["forms"]
    assert status == "ok", _shown(messages)
    assert streamed(messages).count("Wall time: ") == 1, _shown(messages)
    shown = [d.get("text/plain") for d in _displays(messages)]
    assert shown == ["'f-45'", "False"], shown


def test_local_where_and_silent_requests_stay_in_the_kernel(session):
    status, messages = session["local"]
    assert status == "ok" and any(d.get("text/plain") == "8" for d in _displays(messages)), _shown(messages)
    status, messages = session["where"]
    assert status == "ok" and "once, on rank 0: saving" in streamed(messages), _shown(messages)


def test_an_interrupt_stops_training_on_both_ranks_at_the_same_step_and_the_session_goes_on(session):
    status, messages, interrupted = session["interrupt"]
    assert interrupted, _shown(messages)[-3000:]
    assert status == "error" and [e["ename"] for e in _errors(messages)] == ["KeyboardInterrupt"], _shown(messages)
    assert _errors(messages)[0]["traceback"] == ["KeyboardInterrupt: the cell stopped on every rank; the session goes on"]
    assert "training stopped by the interrupt after step" in streamed(messages)
    status, messages = session["after interrupt"]
    assert status == "ok" and "steps agree: True" in streamed(messages), _shown(messages)
    steps = int(streamed(messages).split("steps agree: True")[1].split()[0])
    assert 0 < steps < 100000  # train() began again at step 0


def test_stop_ends_the_session_and_a_new_one_shows_every_rank(session):
    status, messages = session["stop"]
    assert status == "ok" and "the 2 ranks have stopped" in streamed(messages), _shown(messages)
    assert session["stopped"] == []
    status, messages = session["in the kernel again"]
    assert status == "ok" and streamed(messages) == "7\n", _shown(messages)
    status, messages = session["all ranks"]
    lines = streamed(messages).splitlines()
    assert status == "ok" and "hello from rank 0" in lines and "[rank 1] hello from rank 1" in lines, lines


def test_a_rank_that_dies_ends_the_session_and_its_processes_and_says_so(session):
    status, messages = session["death"]
    [error] = _errors(messages)
    assert error["ename"] == "RankFailedError", _shown(messages)
    assert error["evalue"].startswith("rank 1's process ended during the cell") and "%ddp 2 starts a new one" in \
        error["evalue"], error["evalue"]
    assert session["after death"] == []
    assert session["third"][0] == "ok", _shown(session["third"][1])  # a new session starts


def test_a_killed_kernel_leaves_no_rank_or_torchrun(session):
    assert len(session["pids"]) == 3, session["pids"]  # torchrun, then the two ranks
    assert session["left"] == [], "a rank outlived the kernel by 10 s"
    # torchrun gets SIGTERM from the kernel's death and its ranks are gone: it ends, usually within a second; its
    # shutdown has waits of its own of up to 30 s (closing its processes, its rendezvous), and once in a whole-suite
    # run on 2 cores it took over 30 s: the bound is for a torchrun that does not end at all
    assert session["torchrun left"] == [], "torchrun outlived the kernel by 75 s"
    # its log folder stays behind (nothing in the kernel ran again), named so that the next job clears it
    assert [name for name in session["logs left"] if "-session-" in name], session["logs left"]
    assert session["logs swept"] == []


# ---- pure parts: no kernel, no ranks ----

def _shown_by_cell(code, main=True, **names):
    """What a cell converted as the session converts it shows through the session's display hook (nbddp_show)."""
    from nbddp.cellwise.history import History

    shown = []
    namespace = {"nbddp_show": shown.append, "nbddp_barrier": lambda *a: None, "NBDDP_IS_MAIN": main, **names}
    exec(compile(History().convert(code).code, "<cell>", "exec"), namespace)
    return shown


class _Model:
    def generate(self, x):
        return x + 1


@pytest.mark.parametrize("code, main, shown", [
    ("x = 2\nx * 3\n", True, [6]),
    ("x = 2\nx * 3;\n", True, []),  # a trailing semicolon hides it, as in a notebook
    ("x = 2\n", True, []),
    ("out = model.generate(5)\nout\n", True, [6]),  # under the converter's rank-0 guard
    ("out = model.generate(5)\nout\n", False, []),
    ("print\n3\n", True, [3]),
    ("print(3)\n", True, []),  # print's value (None) is not shown
])
def test_a_cells_last_expression_goes_to_the_display_hook(code, main, shown):
    assert _shown_by_cell(code, main, model=_Model()) == shown


def test_the_kernel_reads_a_character_split_between_two_reads_whole():
    from types import SimpleNamespace

    from nbddp.cellwise.kernel import Session

    session, (read, write) = Session(2), os.pipe()
    key = SimpleNamespace(fileobj=os.fdopen(read, "rb", buffering=0), data="stdout")
    block = "\u2588".encode()  # a progress bar's block: 3 bytes
    for part in (b"x" + block[:1], block[1:]):
        os.write(write, part)
        session._read(key)
    os.close(write)
    key.fileobj.close()
    assert session.output.pending["stdout"] == "x\u2588"


def test_a_ranks_traceback_names_the_users_cell_lines():
    from nbddp.cellwise.worker import format_failure

    source = "def f(d):\n    return d['key']\nprint('x')\nf({})\n"
    converted = "def f(d):\n    return d['key']\nif NBDDP_IS_MAIN:\n    print('x')\nnbddp_barrier()\nf({})\n"
    import linecache

    linecache.cache["<nbddp In[4]>"] = (len(converted), None, converted.splitlines(True), "<nbddp In[4]>")
    try:
        exec(compile(converted, "<nbddp In[4]>", "exec"), {"NBDDP_IS_MAIN": False, "nbddp_barrier": lambda: None})
    except KeyError as exc:
        text = format_failure(exc, "<nbddp In[4]>", "Cell In[4]", source)
    assert text.splitlines() == ["Traceback (most recent call last):",
                                 "  Cell In[4], line 4: f({})",  # line 6 of the converted cell, line 4 of the user's
                                 "  Cell In[4], line 2: return d['key']",
                                 "KeyError: 'key'"]


def test_a_ranks_traceback_shows_the_users_line_not_the_rewritten_one():
    """A cell's last value is shown through `nbddp_show(...)`, a print under a guard: the traceback names the line
    as the user wrote it, through the conversion's line map."""
    import linecache

    from nbddp.cellwise.history import History
    from nbddp.cellwise.worker import format_failure

    history = History()
    history.accept("y = {'k': 1}\n", history.convert("y = {'k': 1}\n"))
    source = "print('first')\nz = 2\ny['missing']\n"
    converted = history.convert(source)
    assert "nbddp_show(y['missing'])" in converted.code
    name = "<nbddp In[5]>"
    linecache.cache[name] = (len(converted.code), None, converted.code.splitlines(True), name)
    names = {"y": {"k": 1}, "NBDDP_IS_MAIN": True, "nbddp_barrier": lambda *a: None, "nbddp_show": print}
    try:
        exec(compile(converted.code, name, "exec"), names)
    except KeyError as exc:
        text = format_failure(exc, name, "Cell In[5]", source, converted.lines)
    assert text.splitlines()[1] == "  Cell In[5], line 3: y['missing']", text


def test_cells_converted_one_by_one_are_the_script_cells():
    """Each cell converted with the cells run before it is what `nbddp convert` makes of it in the whole notebook,
    but for what only the whole notebook tells (Options.whole: what training needs, where it ends)."""
    from nbddp.cellwise.history import History
    from nbddp.pipeline import convert_notebook
    from nbddp.transforms.base import Options

    for path in (EXAMPLE_NOTEBOOK,):  # (all 31 corpus notebooks agree too: minutes, so not in the suite)
        nb = nbformat.read(str(path), as_version=4)
        history, one_by_one = History(), []
        for cell in nb.cells:
            if cell.cell_type == "code" and cell.source.strip():
                done = history.convert(cell.source)
                history.accept(cell.source, done)
                one_by_one.append(done.code)
        whole = convert_notebook(str(path), options=Options(whole=False))
        assert one_by_one == [cell.source for cell in whole.cells], path.name


def test_the_example_session_notebook_is_valid_and_its_cells_convert_one_by_one():
    from nbddp.cellwise.history import History

    path = EXAMPLE_NOTEBOOK.parent / "ddp_session.ipynb"
    nb = nbformat.read(str(path), as_version=4)
    nbformat.validate(nb)
    sources = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    start = sources.index("%load_ext nbddp\n%ddp 2")
    assert sources[-1] == "%ddp stop"
    history, done = History(), []
    for source in sources[start + 1:-1]:
        done.append(history.convert(source))
        history.accept(source, done[-1])
    assert "device_map = nbddp_device_map()" in done[0].code and "unsloth_group" in done[0].modules
    assert "with nbddp_main_process_first():" in done[2].code
    assert "if NBDDP_IS_MAIN:\n    outputs = model.generate(" in done[-2].code
    assert done[-1].code.startswith("if NBDDP_IS_MAIN:\n    model.save_pretrained(")


def _answers(run, now, *answers):
    """Feed (rank, kind, fields) answers to a CellRun at time `now`; the barrier numbers it let pass."""
    return [run.message(rank, kind, {"id": 1, **fields}, now) for rank, kind, fields in answers]


def test_cellrun_passes_barriers_when_every_rank_is_there_and_succeeds_when_all_are_done():
    from nbddp.cellwise import wire
    from nbddp.cellwise.cellrun import CellRun

    run = CellRun(1, [0, 1])
    assert _answers(run, 0, (0, wire.BARRIER, {"n": 1}), (1, wire.BARRIER, {"n": 1})) == [None, 1]
    assert run.message(0, wire.DONE, {"id": 2}, 0) is None and run.pending == {0, 1}  # another cell's answer
    _answers(run, 0, (0, wire.DONE, {}), (1, wire.DONE, {}))
    assert not run.pending and run.outcome() is None and run.due(100) == (set(), False)


def test_cellrun_interrupts_the_others_after_one_fails_and_names_the_failing_rank():
    from nbddp.executor import RankFailedError
    from nbddp.cellwise import wire
    from nbddp.cellwise.cellrun import AGREE_WAIT, FAILED_STOP_WAIT, CellRun

    run = CellRun(1, [0, 1])
    _answers(run, 0, (0, wire.BARRIER, {"n": 1}), (1, wire.FAILED, {"traceback": "KeyError: 'k'", "interrupted": False}))
    assert run.due(AGREE_WAIT - 0.1) == (set(), False)  # rank 0 may still fail on its own
    assert run.due(AGREE_WAIT) == ({0}, False) and run.due(AGREE_WAIT + 0.5) == ({0}, False)  # twice
    assert run.due(AGREE_WAIT + 1) == (set(), False)
    stuck = CellRun(1, [0, 1])  # the same, but rank 0 never stops: the session must end
    _answers(stuck, 0, (1, wire.FAILED, {"traceback": "KeyError: 'k'", "interrupted": False}))
    assert stuck.due(AGREE_WAIT) == stuck.due(AGREE_WAIT + 0.5) == ({0}, False)
    assert stuck.due(AGREE_WAIT + FAILED_STOP_WAIT) == (set(), True)
    _answers(run, 4, (0, wire.FAILED, {"traceback": "KeyboardInterrupt", "interrupted": True}))
    error = run.outcome()
    assert isinstance(error, RankFailedError) and error.rank == 1
    assert str(error) == "rank 1 raised KeyError: 'k'; the session goes on: fix the cell and run it again"


def test_cellrun_stops_a_rank_waiting_at_a_barrier_that_the_others_left_behind():
    from nbddp.cellwise import wire
    from nbddp.cellwise.cellrun import CellRun

    run = CellRun(1, [0, 1])
    _answers(run, 0, (1, wire.DONE, {}), (0, wire.BARRIER, {"n": 2}))
    assert run.due(0) == ({0}, False)  # at once: no rank can ever come
    _answers(run, 0, (0, wire.FAILED, {"traceback": "KeyboardInterrupt", "interrupted": True}))
    assert "rank 0 waited at nbddp_barrier #2 of the cell, which rank 1 never reached" in str(run.outcome())


def test_cellrun_interrupted_by_the_kernel_raises_keyboard_interrupt():
    from nbddp.cellwise import wire
    from nbddp.cellwise.cellrun import STOP_WAIT, CellRun

    run = CellRun(1, [0, 1])
    assert run.interrupted(0) == {0, 1}
    assert run.due(STOP_WAIT - 1) == (set(), False) and run.due(STOP_WAIT) == (set(), True)
    _answers(run, 1, *((rank, wire.FAILED, {"traceback": "KeyboardInterrupt", "interrupted": True}) for rank in (0, 1)))
    assert type(run.outcome()) is KeyboardInterrupt
