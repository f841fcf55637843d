"""Launch argv builders: pure functions, no processes."""
import sys

import pytest

from nbddp import launch
from nbddp.cli import main


def test_standalone_argv_runs_torchrun_with_this_interpreter():
    argv = launch.torchrun_argv("train_ddp.py", 2, script_args=["--lr", 1e-4])
    assert argv == [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                    "train_ddp.py", "--lr", "0.0001"]


@pytest.mark.parametrize("flag", ["--nnodes=2", "--rdzv-endpoint=host:29400", "--rdzv_endpoint=host:29400",
                                  "--node-rank=1", "--master-addr=10.0.0.1"])
def test_multi_node_flags_drop_standalone(flag):
    args = launch.torchrun_args(4, [flag])
    assert "--standalone" not in args
    assert args == ["--nproc_per_node=4", flag]


def test_other_flags_keep_standalone():
    assert launch.torchrun_args(8, ["--max-restarts=1"]) == ["--standalone", "--nproc_per_node=8", "--max-restarts=1"]


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
    assert launch.flag_value(flags, ("--nnodes",)) == "2"
    assert launch.has_flag(["--nproc_per_node=3"], launch.NPROC_FLAGS)
    assert not launch.has_flag(flags, launch.NPROC_FLAGS)


def test_output_routing():
    # rank 0 on the console, the other local ranks into log files
    assert launch.output_args(4, log_dir="/l") == ["--log-dir", "/l", "--redirects", "1:3,2:3,3:3"]
    assert launch.output_args(1, log_dir="/l") == ["--log-dir", "/l"]
    # every rank: rank 0 straight to the console, the others through torchrun's tee (prefixed lines)
    assert launch.output_args(3, all_ranks=True, log_dir="/l") == ["--log-dir", "/l", "--tee", "1:3,2:3"]
    # the user's own routing and log dir win
    assert launch.output_args(2, log_dir="/l", torchrun_args=["--tee=1", "--log-dir=/mine"]) == []
    assert launch.RANK_PREFIX_TEMPLATE.replace("${rank}", "1") == "[rank 1] "


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


def test_cli_convert_still_rejects_unknown_flags(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["convert", "nb.ipynb", "--nnodes=2"])
    assert exc.value.code == 2
