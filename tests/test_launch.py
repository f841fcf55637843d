"""The launch recipe (nbddp/runtime/recipe.py, through nbddp/launch.py): pure functions, no processes."""
import shlex

import pytest

from nbddp import launch
from nbddp.cli import main
from nbddp.errors import LaunchError

PY = "/opt/py/bin/python3"


def build(nproc=2, env=None, cpus=8, **kw):
    return launch.build("train_ddp.py", nproc, python=PY, cpus=cpus, env={} if env is None else env, **kw)


def test_a_launch_is_torchrun_with_the_given_interpreter_and_what_it_sets():
    job = build(2, script_args=["--lr", 1e-4], routed=False)
    assert job.argv == [PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "train_ddp.py",
                        "--lr", "0.0001"]
    assert job.env == {"PYTHONUNBUFFERED": "1", "NCCL_NVLS_ENABLE": "0", "OMP_NUM_THREADS": "4",  # 8 cores / 2
                       "PYTHONHASHSEED": "0"}


def test_the_environment_keeps_what_the_user_set():
    job = build(3, env={"OMP_NUM_THREADS": "7", "NCCL_NVLS_ENABLE": "0", "PYTHONHASHSEED": "5"}, cpus=2)
    assert job.env == {"PYTHONUNBUFFERED": "1"}
    assert build(3, cpus=2).env["OMP_NUM_THREADS"] == "1"  # never 0 threads
    assert build(2, all_ranks=True).env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[rank ${rank}] "
    assert launch.RANK_PREFIX_TEMPLATE.replace("${rank}", "1") == "[rank 1] "


@pytest.mark.parametrize("flag", ["--nnodes=2", "--rdzv-endpoint=host:29400", "--rdzv_endpoint=host:29400",
                                  "--node-rank=1", "--master-addr=10.0.0.1"])
def test_multi_node_flags_drop_standalone(flag):
    assert build(4, flags=[flag], routed=False).argv[3:] == ["--nproc_per_node=4", flag, "train_ddp.py"]


def test_other_flags_keep_standalone():
    assert build(8, flags=["--max-restarts=1"], routed=False).argv[3:6] == \
        ["--standalone", "--nproc_per_node=8", "--max-restarts=1"]


def test_output_routing():
    def routing(nproc, **kw):
        return build(nproc, **kw).argv[5:-1]

    # rank 0 on the console, the other local ranks into log files
    assert routing(4, log_dir="/l") == ["--log-dir", "/l", "--redirects", "1:3,2:3,3:3"]
    assert routing(1, log_dir="/l") == ["--log-dir", "/l"]
    # every rank: rank 0 straight to the console, the others through torchrun's tee (prefixed lines)
    assert routing(3, all_ranks=True, log_dir="/l") == ["--log-dir", "/l", "--tee", "1:3,2:3"]
    # the user's own routing and log dir win
    assert routing(2, log_dir="/l", flags=["--tee=1", "--log_dir=/mine"]) == ["--tee=1", "--log_dir=/mine"]


def test_nproc_per_node_is_refused_in_every_launch():
    for flags in (["--nproc_per_node=2"], ["--nproc-per-node", "2"]):
        with pytest.raises(LaunchError, match="give the process count as N"):
            build(2, flags=flags)
        with pytest.raises(LaunchError, match="give the process count as N"):
            launch.torchrun_command("x.py", 2, extra=flags)


def test_parse_nproc():
    assert launch.parse_nproc("3") == 3 and launch.parse_nproc(" 12 ") == 12
    assert launch.parse_nproc("auto", lambda: 4) == 4
    assert launch.parse_nproc("AUTO", lambda: 0) == 2  # no GPU: 2 CPU processes
    for bad in ("0", "two", "-1", "1.5", "auto"):  # 'auto' only where a device count is given
        with pytest.raises(LaunchError):
            launch.parse_nproc(bad)


def test_command_line_is_a_shell_line_of_the_launch():
    job = build(2, all_ranks=True, log_dir="/tmp/my logs")
    line = launch.command_line(job)
    tokens = shlex.split(line)
    assert tokens[:len(job.env)] == [f"{k}={v}" for k, v in job.env.items()]
    assert tokens[len(job.env):] == job.argv
    assert "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank ${rank}] '" in line  # an assignment: only the value quoted


def test_kaggle_command_string():
    assert launch.torchrun_command("train_ddp.py", 2) == "torchrun --standalone --nproc_per_node=2 train_ddp.py"
    assert launch.torchrun_command("my run.py", 2, script_args=["--name", "a b"]) == \
        "torchrun --standalone --nproc_per_node=2 'my run.py' --name 'a b'"


def test_glue_values_joins_torchrun_flag_values_only():
    tokens = ["2", "--nnodes", "2", "--standalone", "--out", "x.py", "--rdzv-endpoint", "h:1", "-r", "3", "--force"]
    assert launch.glue_values(tokens, {"--out", "--force"}) == \
        ["2", "--nnodes=2", "--standalone", "--out", "x.py", "--rdzv-endpoint=h:1", "-r=3", "--force"]


def test_flag_lookup():
    flags = ["--log-dir", "/tmp/l", "--nnodes=2"]
    assert launch.flag_value(flags, launch.LOG_DIR_FLAGS) == "/tmp/l"
    assert launch.flag_value(["--log_dir=/x"], launch.LOG_DIR_FLAGS) == "/x"
    assert launch.flag_value(flags, ("--nnodes",)) == "2"
    assert launch.has_flag(["--nproc_per_node=3"], launch.NPROC_FLAGS)
    assert not launch.has_flag(flags, launch.NPROC_FLAGS)


def test_cli_command_prints_the_kaggle_command_field(capsys):
    assert main(["command"]) == 0
    assert capsys.readouterr().out.strip() == "torchrun --standalone --nproc_per_node=2 train_ddp.py"
    assert main(["command", "finetune.py", "--nproc", "4", "--nnodes", "2", "--rdzv-endpoint", "h:29400",
                 "--", "--epochs", "1"]) == 0
    assert capsys.readouterr().out.strip() == \
        "torchrun --nproc_per_node=4 --nnodes=2 --rdzv-endpoint=h:29400 finetune.py --epochs 1"


def test_cli_command_rejects_a_notebook(capsys):
    assert main(["command", "nb.ipynb"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("nbddp: error: nb.ipynb is a notebook; convert it first") and err.count("\n") == 1


@pytest.mark.parametrize("argv", [["convert", "nb.ipynb", "--nnodes=2"], ["command", "--nproc", "0"],
                                  ["run", "x.py", "--nproc", "two"], ["convert", "nb.ipynb", "--nproc", "auto"]])
def test_cli_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
