"""The executor's helpers (pure), and `nbddp run` end to end on CPU: a failing rank sets the exit status, and the
job runs exactly as `--dry-run` says."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

from e2e import LAUNCHER_PROBE, assert_ran_as_dry_run_said
from nbddp import executor, launch
from nbddp.cli import main
from nbddp.errors import LaunchError

SUMMARY = """\
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train_ddp.py FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 10505)  (SIGTERM)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 10505
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-26_01:41:44
  host      : localhost
  rank      : 3 (local_rank: 1)
  exitcode  : 7 (pid: 10506)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_parse_failure_reads_the_root_cause():
    assert executor.parse_failure(SUMMARY) == (3, 1, 7, "")
    assert executor.parse_failure("no summary here") is None
    killed = SUMMARY.replace("exitcode  : 7 (pid: 10506)", "exitcode  : -9 (pid: 10506)").replace(
        "To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        "Signal 9 (SIGKILL) received by PID 10506")
    assert executor.parse_failure(killed) == (3, 1, -9, "Signal 9 (SIGKILL) received by PID 10506")


def test_last_traceback_skips_torchruns_own_and_strips_rank_prefixes():
    text = textwrap.dedent("""\
        [rank1]: Traceback (most recent call last):
        [rank1]:   File "train_ddp.py", line 9, in <module>
        [rank1]:     raise ValueError("boom")
        [rank1]: ValueError: boom
        W1126 Sending process 1 closing signal SIGTERM
        Traceback (most recent call last):
          File "run.py", line 1, in <module>
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
        """)
    tb = executor.last_traceback(text)
    assert tb.splitlines()[0] == "Traceback (most recent call last):"
    assert tb.splitlines()[-1] == "ValueError: boom"
    assert executor.last_traceback("just\rprogress\n") == ""


def test_rank_failed_error_message_and_exit_status():
    err = executor.RankFailedError(1, 3, "Traceback (most recent call last):\n  File x\nKeyError: 'k'")
    assert str(err) == "rank 1 failed with exit code 3: KeyError: 'k'; fix it and run again"
    assert "\n" not in str(err) and isinstance(err, LaunchError)
    assert err.exit_status() == 3
    assert err._render_traceback_()[-1] == "    KeyError: 'k'"
    killed = executor.RankFailedError(0, -9)
    assert "killed by signal 9 (SIGKILL)" in str(killed) and killed.exit_status() == 137


def test_a_launch_is_unbuffered_and_never_turns_nvls_on():
    env = launch.launch_env({"PATH": "/bin"}, 2, 8)
    assert env == {"PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0", "OMP_NUM_THREADS": "4", "PYTHONHASHSEED": "0"}
    assert "OMP_NUM_THREADS" not in launch.launch_env({"OMP_NUM_THREADS": "3"}, 2, 8)  # the user's stays
    assert "NCCL_NVLS_ENABLE" not in launch.launch_env({"NCCL_NVLS_ENABLE": "0"}, 1, 8)
    assert launch.launch_env({}, 1, 8, all_ranks=True)["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank ${rank}] "


def test_resolve_nproc():
    assert executor.resolve_nproc("3") == 3
    assert executor.resolve_nproc("auto", device_count=lambda: 4) == 4
    assert executor.resolve_nproc("auto", device_count=lambda: 0) == 2  # no GPU: 2 CPU processes
    for bad in ("0", "two", "-1"):
        with pytest.raises(LaunchError):
            executor.resolve_nproc(bad)


def test_plan_is_the_recipe_with_this_process_facts(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    job = executor.plan("s.py", 2, extra=["--max-restarts=1"], script_args=["a"], env={"OMP_NUM_THREADS": "2"})
    own = str(tmp_path / f"nbddp-logs-{os.getpid()}")
    assert job.argv[3:] == ["--standalone", "--nproc_per_node=2", "--log-dir", own, "--redirects", "1:3",
                            "--max-restarts=1", "s.py", "a"]
    assert job.env == {"PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0", "PYTHONHASHSEED": "0"}
    assert executor.plan("s.py", 2, extra=["--log-dir", "/mine"]).argv[5:7] == ["--redirects", "1:3"]


def test_cli_run_rejects_bad_targets(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    assert main(["run", str(tmp_path / "notes.txt"), "--nproc", "2"]) == 1
    assert main(["run", str(tmp_path / "missing.py"), "--nproc", "2"]) == 1
    assert main(["run", str(tmp_path / "x.py"), "--nproc", "2", "--nproc_per_node=2"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("nbddp: error: ") for line in err)


def test_cli_run_converts_a_notebook_dry_run(tmp_path, capsys, monkeypatch):
    import nbformat

    monkeypatch.chdir(tmp_path)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print('hello')")])
    nbformat.write(nb, str(tmp_path / "nb.ipynb"))
    assert main(["run", "nb.ipynb", "--nproc", "2", "--dry-run", "--nnodes", "2", "--rdzv-endpoint", "h:1",
                 "--", "--epochs", "1"]) == 0
    out = capsys.readouterr().out
    assert "-m torch.distributed.run --nproc_per_node=2 --log-dir " in out
    assert "--redirects 1:3 --nnodes=2 --rdzv-endpoint=h:1 train_ddp.py --epochs 1" in out
    assert "Generated by nbddp" in (tmp_path / "train_ddp.py").read_text()


@pytest.mark.ddp
def test_cli_run_failed_rank_sets_exit_status(tmp_path, capsys, monkeypatch):
    """Rank 0 prints a traceback and exits 5: `nbddp run` exits 5, names rank 0 and the exception in one line.
    torchrun ran with the argv and the environment that `--dry-run` printed."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "fails.py"
    script.write_text(LAUNCHER_PROBE + textwrap.dedent("""\
        import os, sys, time, traceback
        rank = int(os.environ["RANK"])
        print(f"rank {rank} args {sys.argv[1:]}", flush=True)
        if rank == 0:
            try:
                raise KeyError("missing-key")
            except KeyError:
                traceback.print_exc()
            sys.exit(5)
        time.sleep(60)
        """))
    argv = ["run", str(script), "--nproc", "2", "--", "--flag", "x"]
    assert main(argv[:-3] + ["--dry-run"] + argv[-3:]) == 0
    dry_run = capsys.readouterr().out.strip()
    status = main(argv)
    out, err = capsys.readouterr()
    assert_ran_as_dry_run_said(dry_run, tmp_path, dict(os.environ))
    assert status == 5, err
    assert "rank 0 args ['--flag', 'x']" in out
    assert "rank 1 args" not in out  # rank 0's output only, by default
    errors = [line for line in err.splitlines() if line.startswith("nbddp: error:")]
    assert errors == ["nbddp: error: rank 0 failed with exit code 5: KeyError: 'missing-key'; fix it and run again"]


def test_the_log_folders_of_a_dead_kernel_go_its_sessions_too(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    names = [f"nbddp-logs-{gone.pid}", f"nbddp-logs-{gone.pid}-session-x1", f"nbddp-logs-{os.getpid()}-session-x2",
             f"nbddp-logs-{os.getppid()}", "nbddp-logs-mine"]
    for name in names:
        (tmp_path / name).mkdir()
    executor.sweep_log_dirs(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names[2:])


@pytest.mark.ddp
def test_cli_run_ends_with_one_line_and_all_ranks_shows_rank_1s_prints(tmp_path, capsys, monkeypatch):
    """`nbddp run` of a converted notebook: the job's last line says it ended well, what it saved and where each
    other rank's output went (a file kept after the job, holding rank 1's warning); `--all-ranks` shows rank 1's
    print on the console, prefixed."""
    import nbddp
    from conftest import make_notebook

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr("tempfile.tempdir", None)
    (tmp_path / "tmp").mkdir()
    code = "import os, warnings, torch\ndef hello():\n    print('PRINT from rank', os.environ['RANK'], flush=True)\n" \
           "    warnings.warn(f\"WARN from rank {os.environ['RANK']}\")\n    torch.distributed.barrier()\nhello()\n"
    (tmp_path / "train_ddp.py").write_text(nbddp.convert(make_notebook(code)), encoding="utf-8")
    assert main(["run", "train_ddp.py", "--nproc", "2"]) == 0
    out, err = capsys.readouterr()
    assert "PRINT from rank 0" in out and "PRINT from rank 1" not in out, out
    end = [line for line in out.splitlines() if line.startswith("nbddp: done (status 0) in ")]
    assert len(end) == 1 and re.match(r"nbddp: done \(status 0\) in [0-9.]+ s; each other rank's output: ", end[0]), out
    logs = end[0].split("each other rank's output: ")[1].split(" (and stdout.log")[0]
    assert "WARN from rank 1" in open(logs.replace("<local rank>", "1")).read()
    assert main(["run", "train_ddp.py", "--nproc", "2", "--all-ranks"]) == 0
    out, err = capsys.readouterr()
    assert "[rank 1] PRINT from rank 1" in out.splitlines(), out
