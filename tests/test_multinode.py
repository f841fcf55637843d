"""More than 2 ranks, and more than one node's worth of ranks (RANK != LOCAL_RANK), on CPU under gloo.

Two "nodes" are two torchrun launchers on this machine, `--nnodes=2 --node-rank=0|1 --nproc_per_node=2` with a
static rendezvous on 127.0.0.1, started at once in one shared working directory (a shared filesystem, as on a
cluster). Global ranks 0-1 belong to node 0 and 2-3 to node 1, whose local ranks are again 0 and 1.

  * the example notebook, converted by nbddp, as one 4-process job over 2 nodes (one job, shared by the tests);
  * the `%%torchrun` magic with 4 processes, and as node 0 of a 2-node job whose node 1 is a plain torchrun;
  * the runtime layer's DDP cases (tests/runtime_cases/ddp_cases.py layer) with 4 processes.

docs/multinode.md says what runs once per job and what once per machine; these tests back it.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import textwrap

import nbformat
import pytest

from e2e import (MAX_STEPS, PER_DEVICE, ROWS, SCRIPT, AtOnce, Job, assert_clean_exit, assert_trained, child_env,
                 torchrun_launch)
from tinymodels import EXAMPLE_NOTEBOOK

pytestmark = pytest.mark.ddp

NODES, PER_NODE = 2, 2
WORLD = NODES * PER_NODE
CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runtime_cases")

# Put into the example notebook before its training cell: each rank records who it is, as the generated script's
# helpers, torchrun's environment and the Trainer see it. A file per rank (prints would be rank-0-only).
PROBE_CELL = textwrap.dedent("""\
    import json, os
    with open(f"probe-rank-{NBDDP_RANK}.json", "w") as fh:
        json.dump({"rank": NBDDP_RANK, "local_rank": NBDDP_LOCAL_RANK, "world": NBDDP_WORLD_SIZE,
                   "is_main": NBDDP_IS_MAIN, "is_local_main": NBDDP_IS_LOCAL_MAIN,
                   "group_rank": int(os.environ["GROUP_RANK"]), "trainer_rank": trainer.args.process_index,
                   "trainer_local_rank": trainer.args.local_process_index,
                   "trainer_world": trainer.args.world_size}, fh)
    """)


def free_port(given=set()) -> int:
    """A free port, and never one given before (two jobs may start at once)."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            if sock.getsockname()[1] not in given:
                given.add(sock.getsockname()[1])
                return sock.getsockname()[1]


def node_launch(node_rank: int, port: int, cwd, script: str = SCRIPT):
    """(argv, environment) of one node's torchrun launcher, built by nbddp's recipe."""
    return torchrun_launch(script, PER_NODE, child_env(cwd), flags=[
        f"--nnodes={NODES}", f"--node-rank={node_rank}", "--master-addr=127.0.0.1", f"--master-port={port}"])


def start_two_nodes(cwd, script: str = SCRIPT, timeout: int = 300) -> AtOnce:
    """Both launchers at once in `cwd` (one folder, shared; or a list: each node's own folder and Hugging Face
    cache, as machines without shared storage); .jobs(): one Job per node, in node order."""
    port, cwds = free_port(), cwd if isinstance(cwd, list) else [cwd] * NODES
    return AtOnce([(argv, cwds[node], env) for node in range(NODES)
                   for argv, env in [node_launch(node, port, cwds[node], script)]], timeout)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, own_disks):
    """(node 0, node 1, both combined): the example notebook with PROBE_CELL, one job of 2 nodes x 2 processes."""
    import nbddp

    nb = nbformat.read(str(EXAMPLE_NOTEBOOK), as_version=4)
    train = next(i for i, cell in enumerate(nb.cells) if "trainer.train()" in cell.source)
    nb.cells.insert(train, nbformat.v4.new_code_cell(PROBE_CELL))  # before training's end: every rank runs it
    cwd = tmp_path_factory.mktemp("two-nodes")
    (cwd / SCRIPT).write_text(nbddp.convert(nb), encoding="utf-8")
    node0, node1 = start_two_nodes(cwd).jobs()
    both = Job(node0.argv + ["+"] + node1.argv, cwd, node0.returncode or node1.returncode,
               node0.stdout + node1.stdout, node0.stderr + node1.stderr, max(node0.seconds, node1.seconds))
    return node0, node1, both


def test_two_node_launchers_exit_cleanly(two_nodes):
    node0, node1, both = two_nodes
    assert_clean_exit(node0)
    assert_clean_exit(node1)
    assert both.count(f"nbddp: {WORLD} processes, this one is rank 0") == 1, both.explain()
    assert node1.count("nbddp: ") == 0, node1.explain()  # node 1 holds no global rank 0: it prints nothing of nbddp's


def test_ranks_span_two_nodes(two_nodes):
    """Global ranks 0-3; node 1's ranks 2 and 3 have local ranks 0 and 1, and the Trainer agrees."""
    _, _, both = two_nodes
    probes = {}
    for rank in range(WORLD):
        path = both.cwd / f"probe-rank-{rank}.json"
        assert path.is_file(), both.explain()
        probes[rank] = json.loads(path.read_text())
    for rank, seen in probes.items():
        node, local = divmod(rank, PER_NODE)
        assert seen == {"rank": rank, "local_rank": local, "world": WORLD, "is_main": rank == 0,
                        "is_local_main": local == 0, "group_rank": node, "trainer_rank": rank,
                        "trainer_local_rank": local, "trainer_world": WORLD}, seen


def test_two_nodes_train_as_one_four_process_job(two_nodes):
    # 6 steps x 2 rows per process x 4 processes = 48 rows of 16: epoch 3.0 (1.5 with 2 processes, 0.75 with one).
    _, _, both = two_nodes
    assert MAX_STEPS * PER_DEVICE * WORLD / ROWS == 3.0
    assert "parallel_mode != ParallelMode.DISTRIBUTED" not in both.stderr, both.explain()
    assert_trained(both, world_size=WORLD)  # also: the Trainer logged each step once in the whole job


def test_save_and_generation_run_once_per_job(two_nodes):
    node0, _, both = two_nodes
    saved = both.cwd / "lora_model"
    assert (saved / "adapter_config.json").is_file(), both.explain()
    assert (saved / "adapter_model.safetensors").is_file(), both.explain()
    assert (both.cwd / "tiny-llama" / "model.safetensors").is_file()
    for marker in ("Saved the LoRA adapters", "Generated:", "seconds used for training on"):
        assert both.count(marker) == 1, both.explain()
        assert node0.count(marker) == 1, marker  # and from node 0, the node of global rank 0
    assert len((both.cwd / "tiny_alpaca.jsonl").read_text().splitlines()) == ROWS  # %%writefile: once per node,
    # same bytes from both nodes' local rank 0 on the shared folder: whole, not doubled


OWN_DISKS = [
    "%%writefile rows.jsonl\n" + "".join(f'{{"text": "row {i} of the notebook\'s own data"}}\n' for i in range(8)),
    "!echo shell >> shell.log\n",
    "from datasets import load_dataset\nfrom transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, "
    "TrainingArguments\nfrom transformers import DataCollatorForLanguageModeling\n",
    "base = AutoModelForCausalLM.from_pretrained('tiny-llama')\nbase.save_pretrained('base')\n",  # what each machine loads
    "tokenizer = AutoTokenizer.from_pretrained('tiny-llama')\nmodel = AutoModelForCausalLM.from_pretrained('base')\n"
    "ds = load_dataset('json', data_files = 'rows.jsonl', split = 'train')\n"
    "ds = ds.map(lambda b: tokenizer(b['text']), batched = True, remove_columns = ['text'])\n",
    "args = TrainingArguments(output_dir = 'out', per_device_train_batch_size = 1, max_steps = 2, save_strategy = 'no',\n"
    "                         report_to = 'none', use_cpu = True)\n"
    "trainer = Trainer(model = model, args = args, train_dataset = ds,\n"
    "                  data_collator = DataCollatorForLanguageModeling(tokenizer, mlm = False))\ntrainer.train()\n",
    "model.save_pretrained('trained')\n",
]


@pytest.fixture(scope="module")
def own_disks(tmp_path_factory):
    """test_machines_without_shared_storage's job (2 machines' folders, each with its tiny Llama), started in the
    background before two_nodes' job: the two run at once (no check of either reads time)."""
    import nbddp

    from conftest import make_notebook
    from tinymodels import save_tiny_llama

    folders = [tmp_path_factory.mktemp(f"machine{node}") for node in range(NODES)]
    script = nbddp.convert(make_notebook(*OWN_DISKS))
    for folder in folders:
        save_tiny_llama(folder / "tiny-llama")
        (folder / SCRIPT).write_text(script, encoding="utf-8")
    started = start_two_nodes(folders)
    yield folders, started
    started.close()


def test_machines_without_shared_storage(own_disks):
    """Two nodes, each in its own folder with its own Hugging Face cache (as two machines with their own disks, the
    base model on each): %%writefile, `!` commands and data preparation run once on each machine, into its own
    folder and cache; a save that every rank loads back before training once on each machine; the save after
    training once per job, on rank 0's machine; the 4 ranks agree; the machine that does not see rank 0's folder
    says what that means."""
    folders, started = own_disks
    node0, node1 = started.jobs()
    for node in (node0, node1):
        assert_clean_exit(node)
    for folder in folders:
        assert len((folder / "rows.jsonl").read_text().splitlines()) == 8, folder
        assert (folder / "shell.log").read_text() == "shell\n", folder  # once per machine
        assert list((folder / "hf" / "datasets").iterdir()), folder  # each machine's own cache, filled there
        assert (folder / "base" / "config.json").is_file(), folder  # saved there, then loaded by its ranks
    assert (folders[0] / "trained" / "adapter_config.json").is_file() or \
        (folders[0] / "trained" / "config.json").is_file(), node0.explain()
    assert not (folders[1] / "trained").exists(), node1.explain()  # once per job
    assert node0.count(f"nbddp: ranks agree after train(): all {WORLD} hold the same weights") == 1, node0.explain()
    said = [line for line in node1.stderr.splitlines() if "does not see rank 0's working folder" in line]
    assert len(said) == 1 and "rank 2's machine" in said[0], node1.explain()
    assert "does not see" not in node0.stderr, node0.explain()
    assert not list(folders[0].glob(".nbddp-shared-*")), "rank 0's marker is removed at the end"


def test_a_rank_that_fails_stops_the_other_machine(tmp_path):
    """Rank 2 fails while rank 0 waits for it at a barrier on the other machine: node 1's launcher stops its own
    ranks, and rank 0's machine learns it from the store and stops too, in seconds, saying why (each launcher sees
    only its own machine's ranks: without that, machine 0 waits forever)."""
    import nbddp

    from conftest import make_notebook

    cells = ["import os\nif os.environ['RANK'] == '2':\n    raise ValueError('rank 2 cannot go on')\n",
             "print('rank 0 goes on')\n"]  # rank-0 work: the other ranks wait for it at a barrier
    folders = [tmp_path / f"machine{node}" for node in range(NODES)]
    for folder in folders:
        folder.mkdir()
        (folder / SCRIPT).write_text(nbddp.convert(make_notebook(*cells)), encoding="utf-8")
    node0, node1 = start_two_nodes(folders, timeout=150).jobs()
    assert node1.returncode != 0 and "ValueError: rank 2 cannot go on" in node1.stderr, node1.explain()
    assert node0.returncode != 0, node0.explain()
    said = [line for line in node0.stderr.splitlines() if line.startswith("nbddp: rank 2 failed")]
    assert any(line.startswith("nbddp: rank 2 failed (ValueError: rank 2 cannot go on); rank 0 stops too")
               for line in said), node0.explain()
    assert max(node0.seconds, node1.seconds) < 120, (node0.seconds, node1.seconds)


# ---- the %%torchrun magic ----

RANKS_CELL = textwrap.dedent("""\
    import os
    import torch
    import torch.distributed as dist
    nbddp_dist()
    t = torch.tensor([NBDDP_RANK + 1.0])
    dist.all_reduce(t)
    me = (NBDDP_RANK, NBDDP_LOCAL_RANK, NBDDP_WORLD_SIZE, dist.get_rank(), dist.get_world_size(),
          int(os.environ["GROUP_RANK"]), NBDDP_IS_MAIN, NBDDP_IS_LOCAL_MAIN)
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, me)
    if NBDDP_RANK == 0:
        print(f"sum={t.item()}")
        for seen in everyone:
            print("seen", *seen)
    """)


def expected_seen(nodes: int, per_node: int) -> list[str]:
    world = nodes * per_node
    return [f"seen {r} {r % per_node} {world} {r} {world} {r // per_node} {r == 0} {r % per_node == 0}"
            for r in range(world)]


def seen_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("seen ")]


def test_cell_magic_four_processes(ip, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ip.run_cell_magic("torchrun", str(WORLD), RANKS_CELL)
    out = capsys.readouterr().out
    assert "sum=10.0" in out, out  # 1 + 2 + 3 + 4: all four ranks took part
    assert seen_lines(out) == expected_seen(1, WORLD), out  # one node: RANK == LOCAL_RANK


def test_cell_magic_as_node_0_of_two(ip, tmp_path, monkeypatch, capsys):
    """`%%torchrun 2 --nnodes=2 --node-rank=0 --master-addr=... --master-port=...` in the kernel, node 1 a plain
    torchrun of the same script: one 4-rank job, rank 0's output in the cell."""
    monkeypatch.chdir(tmp_path)
    port = free_port()
    flags = f"--nnodes={NODES} --master-addr=127.0.0.1 --master-port={port}"
    ip.run_cell_magic("torchrun", f"{PER_NODE} --dry-run {flags} --node-rank=0", RANKS_CELL)
    dry = capsys.readouterr().out
    assert (f"--redirects 1:3 --nnodes={NODES} --master-addr=127.0.0.1 --master-port={port} "
            f"--node-rank=0 {SCRIPT}") in dry, dry
    assert "--standalone" not in dry
    argv, env = node_launch(1, port, tmp_path)
    node1 = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ip.run_cell_magic("torchrun", f"{PER_NODE} {flags} --node-rank=0", RANKS_CELL)
        out1, err1 = node1.communicate(timeout=120)
    finally:
        if node1.poll() is None:
            node1.kill()
            node1.communicate()
    out = capsys.readouterr().out
    assert node1.returncode == 0, out1[-2000:] + err1[-4000:]
    assert "sum=10.0" in out, out
    assert seen_lines(out) == expected_seen(NODES, PER_NODE), out  # ranks 2 and 3: local ranks 0 and 1
    assert "sum=" not in out1 and "seen" not in out1  # node 1 has no rank 0


def test_line_magic_passes_multinode_flags(ip, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ip.run_line_magic("torchrun", "4 --dry-run --nnodes=2 --node-rank=1 --rdzv-backend=c10d "
                                  "--rdzv-endpoint=head:29400 --rdzv-id=job7 train.py --epochs 1")
    out = capsys.readouterr().out
    assert "-m torch.distributed.run --nproc_per_node=4 --log-dir " in out, out
    assert (" --redirects 1:3,2:3,3:3 --nnodes=2 --node-rank=1 --rdzv-backend=c10d --rdzv-endpoint=head:29400 "
            "--rdzv-id=job7 train.py --epochs 1") in out, out
    assert "--standalone" not in out


# ---- the runtime layer ----

def test_runtime_layer_cases_with_four_processes():
    """ddp_cases.py layer: every case trains to the weights of one process on the global batch, with 4 ranks
    (its batch of 4 splits to 1 row per rank), and the layer chooses what it chooses with 2."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                             "MASTER_PORT", "NBDDP_OUTCOME_DIR")}
    env["OMP_NUM_THREADS"] = "1"
    argv, env = torchrun_launch(os.path.join(CASES, "ddp_cases.py"), WORLD, env, script_args=["layer"])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env, cwd=CASES)
    results = [json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and len(results) == 16, done.stdout[-2000:] + done.stderr[-3000:]
    bad = [r for r in results if r["outcome"] != "trains, same weights as one process"]
    assert not bad, bad
    assert max(r["max_abs_diff"] for r in results) < 1e-10
    chosen = {(r["ckpt"], r["unused"]): (r["static"], r["find_unused"]) for r in results if not r.get("applied")}
    assert chosen[("reentrant", False)] == (False, False)
    assert chosen[("none", True)] == (False, True)
    assert chosen[("reentrant", True)] == (False, True)
    assert [r["applied"] for r in results if r.get("applied")] == ["lazily"]
