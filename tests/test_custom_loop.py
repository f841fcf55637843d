"""A training loop of the notebook's own (no Trainer): converted, it trains one model on every rank.

Before/after strings for the rewrite, and one real run on CPU: the notebook's loop (inside the notebook's own
function, over a DataLoader) as a 2-process torchrun job with 2 rows per process, against one process with 4 rows
a step: the same global batch and data order, so the trained LoRA weights must match, and both ranks must hold the
same weights. Without the rewrite each rank would train alone on all the rows, 2 a step: other weights.
"""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

from conftest import make_notebook
from e2e import SCRIPT, assert_clean_exit, run_jobs
from test_transforms import convert_cells
from tinymodels import alpaca_texts, save_tiny_llama

SETUP = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(rows, batch_size=4, shuffle=True)
""")


def _converted(*cells):
    sources, report = convert_cells(SETUP, *(textwrap.dedent(c) for c in cells))
    return sources[1:], report


def test_a_top_level_loop_trains_through_ddp_on_each_ranks_share():
    (loop,), report = _converted("""\
        for epoch in range(3):
            for step, batch in enumerate(loader):
                loss = model(**batch).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    """)
    assert loop == textwrap.dedent("""\
        nbddp_ddp(model)
        for epoch in range(3):
            for step, batch in enumerate(nbddp_distributed(loader)):
                loss = model(**batch).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    """)
    assert any("model trains through DDP" in n.text and n.cell == 2 for n in report.changes)


@pytest.mark.parametrize("outer, made", [
    ("for lr in (0.1, 0.01):\n", "    net = torch.nn.Linear(4, 1)\n    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"),
    ("trial = 0\nwhile trial < 2:\n    trial += 1\n", "    net = make_model()\n    opt = torch.optim.AdamW(net.parameters())\n"),
    ("def new():\n    return torch.nn.Linear(4, 1)\nfor seed in range(2):\n",  # made by the notebook's function
     "    net = new()\n    opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"),
])
def test_a_loop_that_makes_its_model_anew_each_pass_wraps_it_where_it_is_made(outer, made):
    """A search over settings that makes a new model each pass: the loop inside it, after the model is made, is the
    one converted (before, `nbddp_ddp(net)` came before the outer loop: a NameError, or an older model wrapped)."""
    inner = "    for batch in loader:\n        opt.zero_grad()\n        net(batch).sum().backward()\n        opt.step()\n"
    (loop,), _ = _converted(outer + made + inner)
    assert loop == outer + made + "    nbddp_ddp(net)\n" + inner.replace("in loader", "in nbddp_distributed(loader)"), loop


def test_a_loop_that_trains_then_validates_each_epoch_with_a_criterion_trains_through_ddp():
    """model.train()/model.eval(), a loss from a criterion object, the validation inside the epoch; the loop's cell
    is named where the notebook has cells after it."""
    (loop, _), report = _converted("""\
        criterion = torch.nn.CrossEntropyLoss()
        for epoch in range(2):
            model.train()
            for x, y in loader:
                optimizer.zero_grad()
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
            model.eval()
            correct = 0
            with torch.no_grad():
                for x, y in val_loader:
                    correct += (model(x).argmax(1) == y).sum().item()
    """, "print('done')\n")
    assert "nbddp_ddp(model)\nfor epoch in range(2):\n" in loop
    assert "    for x, y in nbddp_distributed(loader):\n" in loop and "for x, y in val_loader:" in loop
    assert any("model trains through DDP" in n.text and n.cell == 2 for n in report.changes)


def test_a_loop_whose_model_cannot_be_told_is_named_by_its_own_cell():
    (loop, _), report = _converted("""\
        for step in range(3):
            compute().backward()
            make_optimizer().step()
    """, "print('after')\n")
    assert loop.startswith("nbddp_unsynced_loop('the training loop of cell 2')\n")
    assert any("cannot tell" in n.text and n.cell == 2 for n in report.warnings)


def test_a_loop_in_the_notebooks_function_follows_the_call_and_a_grad_scaler():
    (loop,), _ = _converted("""\
        def fit(net, opt, data, scaler):
            for x in tqdm(data):
                scaler.scale(net(**x).loss).backward()
                scaler.step(opt)
                scaler.update()
        fit(model, optimizer, loader, torch.amp.GradScaler())
    """)
    assert "    nbddp_ddp(net)\n    for x in tqdm(nbddp_distributed(data)):\n" in loop


def test_an_optimizer_made_in_the_call_of_the_notebooks_function():
    (loop,), _ = _converted("def fit(net, opt, data):\n    for b in data:\n        net(**b).loss.backward()\n"
                            "        opt.step()\nfit(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)\n")
    assert loop.startswith("def fit(net, opt, data):\n    nbddp_ddp(net)\n    for b in nbddp_distributed(data):\n")


def test_a_loop_over_the_notebooks_step_function_and_an_aliased_optimizer_in_another_cell():
    sources, _ = _converted(
        "from torch.optim import AdamW as Opt\no = Opt(model.parameters())\n",
        "def train_step(batch):\n    model(**batch).loss.backward()\n    o.step()\n    o.zero_grad()\n",
        "for epoch in range(2):\n    for batch in loader:\n        train_step(batch)\n",
    )
    assert sources[1] == "def train_step(batch):\n    model(**batch).loss.backward()\n    o.step()\n    o.zero_grad()\n"
    assert sources[2] == ("nbddp_ddp(model)\nfor epoch in range(2):\n    for batch in nbddp_distributed(loader):\n"
                          "        train_step(batch)\n")


def test_a_loop_stepping_a_parameter_whatever_its_name_follows_the_calls_value():
    (loop,), report = _converted("""\
        def train_epoch(m, o, data):
            for step, batch in enumerate(data):
                m(**batch).loss.backward()
                o.step(); o.zero_grad()
        for epoch in range(3):
            train_epoch(model, optimizer, loader)
    """)
    assert loop.startswith("def train_epoch(m, o, data):\n    nbddp_ddp(m)\n"
                           "    for step, batch in enumerate(nbddp_distributed(data)):\n")
    assert "for epoch in range(3):\n    train_epoch(model, optimizer, loader)\n" in loop  # the caller unchanged
    assert any("m trains through DDP" in n.text for n in report.changes)


@pytest.mark.parametrize("signature, call", [
    ("net, data, *, o", "fit(model, loader, o=optimizer)"),  # keyword-only
    ("net, o, /, data", "fit(model, optimizer, loader)"),  # positional-only
    ("net, o, data", "def main():\n    fit(model, optimizer, loader)\nmain()"),  # called from another def
    ("net, o, data", "def run(m, opt2):\n    fit(m, opt2, loader)\nrun(model, optimizer)"),  # passed on twice
    ("net, o, data", "def run(*, steps):\n    fit(net=model, o=steps, data=loader)\nrun(steps=optimizer)"),
])
def test_the_optimizer_parameter_is_followed_however_the_function_is_declared_and_called(signature, call):
    loop = f"def fit({signature}):\n    for b in data:\n        net(**b).loss.backward()\n        o.step()\n"
    (converted,), report = _converted(loop + call + "\n")
    assert converted == (f"def fit({signature}):\n    nbddp_ddp(net)\n    for b in nbddp_distributed(data):\n"
                         "        net(**b).loss.backward()\n        o.step()\n" + call + "\n")
    assert not report.warnings


@pytest.mark.parametrize("run", [
    "def run(m, x):\n    fit(m, x, loader)\nrun(model, make_optimizer())\n",  # never given an optimizer
    "def run(m, x):\n    x = make_optimizer()\n    fit(m, x, loader)\nrun(model, optimizer)\n",  # rebound first
])
def test_a_parameter_passed_on_without_a_known_optimizer_still_stops_the_script(run):
    code = "def fit(net, o, data):\n    for b in data:\n        net(**b).loss.backward()\n        o.step()\n" + run
    (converted,), report = _converted(code)
    assert converted.startswith("def fit(net, o, data):\n    nbddp_unsynced_loop('the training loop of cell 2')\n")
    assert any("cannot tell" in n.text for n in report.warnings)


def test_an_optimizer_built_from_named_parameters_or_parameter_groups_finds_its_model():
    sources, report = _converted(
        "params = [p for p in net.parameters() if p.requires_grad]\nopt = torch.optim.SGD(params, lr=0.1)\n",
        "for b in loader:\n    net(**b).loss.backward()\n    opt.step()\n",
        "groups = [{'params': [p for n, p in head.named_parameters() if 'bias' not in n], 'weight_decay': 0.01}]\n"
        "optimizer = torch.optim.AdamW(groups)\n",
        "for b in loader:\n    head(**b).loss.backward()\n    optimizer.step()\n",
    )
    assert sources[1] == "nbddp_ddp(net)\nfor b in nbddp_distributed(loader):\n    net(**b).loss.backward()\n    opt.step()\n"
    assert sources[3] == ("nbddp_ddp(head)\nfor b in nbddp_distributed(loader):\n    head(**b).loss.backward()\n"
                          "    optimizer.step()\n")
    assert not report.warnings
    attribute = "o = torch.optim.SGD(cfg.params)\nfor b in loader:\n    net(**b).loss.backward()\n    o.step()\n"
    (unknown,), _ = _converted("params = net.parameters()\n" + attribute)  # cfg.params is not the global params
    assert unknown.startswith("params = net.parameters()\no = torch.optim.SGD(cfg.params)\nnbddp_unsynced_loop(")


def test_loops_that_do_not_train_or_distribute_themselves_are_left_alone():
    unchanged = [
        "for batch in loader:\n    print(model(**batch).loss)\n",              # no backward
        "for batch in loader:\n    model(**batch).loss.backward()\n",            # backward, no step
        "def train_step(batch):\n    model(**batch).loss.backward()\n    optimizer.step()\n",  # no loop
        "if False:\n    for b in loader:\n        model(**b).loss.backward()\n        optimizer.step()\n",
    ]
    assert [_converted(source)[0][0] for source in unchanged] == unchanged
    own = "from accelerate import Accelerator\naccelerator = Accelerator()\n" \
          "for b in loader:\n    accelerator.backward(model(**b).loss)\n    optimizer.step()\n"
    assert _converted(own)[0] == [own]


def test_a_loop_whose_model_cannot_be_told_stops_the_script_before_it():
    (loop,), report = _converted("""\
        def fit(opt):
            while True:
                compute().backward()
                opt.step()
        fit(make_optimizer())
    """)
    assert "    nbddp_unsynced_loop('the training loop of cell 2')\n    while True:\n" in loop
    assert any("cannot tell" in n.text for n in report.warnings)


def test_converting_the_converted_loop_changes_nothing():
    cell = "for b in loader:\n    model(**b).loss.backward()\n    optimizer.step()\n"
    (once,), _ = _converted(cell)
    (twice,), _ = _converted(once)
    assert twice == once and once.startswith("nbddp_ddp(model)\n")


def _notebook(texts):
    return make_notebook(
        "import json, os, torch\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "from peft import LoraConfig, get_peft_model\n"
        "torch.manual_seed(0)\n"
        "model = AutoModelForCausalLM.from_pretrained('tiny-llama')\n"
        "tokenizer = AutoTokenizer.from_pretrained('tiny-llama')\n"
        "model = get_peft_model(model, LoraConfig(r=4, target_modules=['q_proj', 'v_proj'], lora_dropout=0.0))\n",
        f"from torch.utils.data import DataLoader\ntexts = {texts!r}\n"
        "enc = tokenizer(texts, padding='max_length', max_length=40, truncation=True, return_tensors='pt')\n"
        "rows = [{'input_ids': i, 'attention_mask': m} for i, m in zip(enc['input_ids'], enc['attention_mask'])]\n"
        "loader = DataLoader(rows, batch_size=int(os.environ['LOOP_BATCH']))\n"
        "optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)\n",
        "def train(net, opt, data, epochs):\n    net.train()\n    for epoch in range(epochs):\n"
        "        for batch in data:\n            out = net(**batch, labels=batch['input_ids'])\n"
        "            out.loss.backward()\n            opt.step()\n            opt.zero_grad()\n"
        "    weights = {n: p.detach().flatten().tolist() for n, p in net.named_parameters() if p.requires_grad}\n"
        "    with open(f\"weights-{os.environ.get('RANK', '0')}.json\", 'w') as fh:\n"
        "        fh.write(json.dumps(weights))  # each rank's, before training's end: rank 0 alone runs the rest\n"
        "train(model, optimizer, loader, 2)\n",
    )


@pytest.fixture(scope="module")
def loop_jobs(tmp_path_factory):
    """The jobs of the two tests below, each in its own folder, all at once (e2e.run_jobs: none reads time):
    (the folder, the loop's script, {name: the job}, the epochs notebook's conversion)."""
    import nbddp

    from e2e import notebook_job

    tmp_path = tmp_path_factory.mktemp("loops")
    script = nbddp.convert(_notebook(alpaca_texts() * 2))
    started = []
    for name, argv, batch in (("ddp", ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"], "4"),
                              ("one", [], "4")):  # the notebook's batch of 4: 2 samples of each on each rank
        save_tiny_llama((cwd := tmp_path / name) / "tiny-llama")
        (cwd / SCRIPT).write_text(script, encoding="utf-8")
        started.append(([sys.executable, *argv, SCRIPT], cwd, {"LOOP_BATCH": batch, "NBDDP_NPROC": "1"}))
    (tmp_path / "epochs").mkdir()
    epochs, conversion = notebook_job(EPOCHS, tmp_path / "epochs")
    runs = dict(zip(("ddp", "one", "epochs"), run_jobs(started + [epochs])))
    return tmp_path, script, runs, conversion


@pytest.mark.ddp
def test_the_loop_trains_one_model_as_one_process_does_at_the_same_global_batch(loop_jobs):
    torch = pytest.importorskip("torch")
    tmp_path, script, runs, _ = loop_jobs
    assert "nbddp_ddp(net)" in script and "for batch in nbddp_distributed(data):" in script
    runs = {name: runs[name] for name in ("ddp", "one")}
    for job in runs.values():
        assert_clean_exit(job)
    assert runs["ddp"].count("nbddp: the notebook's training loop trains one PeftModel") == 1, runs["ddp"].explain()
    assert runs["ddp"].count("nbddp: the training loop's DataLoader keeps the notebook's batch of 4: each of 2 "
                             "processes takes 2 samples of every batch") == 1, runs["ddp"].explain()
    assert runs["ddp"].count("nbddp: ranks agree after") == 1, runs["ddp"].explain()  # the runtime's own check

    def weights(path):
        return {k: torch.tensor(v) for k, v in json.loads(path.read_text()).items()}

    rank0, rank1 = weights(tmp_path / "ddp" / "weights-0.json"), weights(tmp_path / "ddp" / "weights-1.json")
    one = weights(tmp_path / "one" / "weights-0.json")
    assert rank0.keys() == one.keys() and len(one) == 8  # lora_A and lora_B of q and v in 2 layers
    for name in one:
        assert torch.equal(rank0[name], rank1[name]), name
        assert torch.allclose(rank0[name], one[name], atol=2e-5, rtol=1e-4), (name, (rank0[name] - one[name]).abs().max())


EPOCHS = [
    "import json, os, torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\n",
    "g = torch.Generator().manual_seed(0)\nX = torch.randn(64, 4, generator = g)\ny = (X.sum(1) > 0).long()\n"
    "train_dl = DataLoader(TensorDataset(X[:48], y[:48]), batch_size = 8, shuffle = True)\n"
    "val_dl = DataLoader(TensorDataset(X[48:], y[48:]), batch_size = 8)\n",
    "torch.manual_seed(0)\nmodel = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))\n"
    "criterion = nn.CrossEntropyLoss()\nopt = torch.optim.SGD(model.parameters(), lr = 0.1)\n",
    "def run_epoch(model, loader, opt, criterion):\n    model.train()\n    total = 0.0\n    for xb, yb in loader:\n"
    "        opt.zero_grad()\n        loss = criterion(model(xb), yb)\n        loss.backward()\n        opt.step()\n"
    "        total += loss.item()\n    return total / len(loader)\n",
    "def evaluate(model, loader):\n    model.eval()\n    correct = n = 0\n    with torch.no_grad():\n"
    "        for xb, yb in loader:\n            correct += (model(xb).argmax(1) == yb).sum().item()\n"
    "            n += len(yb)\n    return correct / n\n",
    "for epoch in range(3):\n    train_loss = run_epoch(model, train_dl, opt, criterion)\n"
    "    acc = evaluate(model, val_dl)\n    print(f'EPOCH {epoch} acc {acc:.4f}')\n"
    "    with open(f\"val-{os.environ['RANK']}.json\", 'w') as fh:\n"
    "        json.dump({'acc': acc, 'seen': len(val_dl.dataset),\n"
    "                   'weight': model[0].weight.sum().item()}, fh)\n",
    "torch.save(model.state_dict(), 'model.pt')\nprint('SAVED')\n",
]


@pytest.mark.ddp
def test_a_loop_that_trains_then_validates_each_epoch_trains_one_model(loop_jobs):
    """The usual shape: the epoch loop calls the notebook's train function (its own loop is the one converted) and
    an evaluation function; every rank validates on the whole validation set, so the accuracy printed once is the
    whole set's, and every rank holds the same weights."""
    _, _, runs, conversion = loop_jobs
    done = runs["epochs"]
    tmp_path = done.cwd
    assert_clean_exit(done)
    assert "nbddp_unsynced_loop" not in conversion.script and "nbddp_ddp(model)" in conversion.script
    records = [json.loads((tmp_path / f"val-{rank}.json").read_text()) for rank in range(2)]
    assert records[0] == records[1] and records[0]["seen"] == 16, records
    assert done.count("EPOCH 2 acc") == 1 and done.count("SAVED") == 1, done.explain()


@pytest.mark.parametrize("make", [
    "from lion_pytorch import Lion\nopt = Lion(model.parameters(), lr = 1e-4)\n",
    "import timm.optim as to\nopt = to.Lamb([p for p in model.parameters() if p.requires_grad])\n",
])
def test_an_optimizer_of_a_library_nbddp_has_no_entry_for_is_known_by_the_parameters_it_was_built_from(make):
    loop = "for batch in loader:\n    loss = model(batch).mean()\n    loss.backward()\n    opt.step()\n"
    out, _ = convert_cells("import torch\nmodel = torch.nn.Linear(2, 1)\n" + make, loop)
    assert out[1].startswith("nbddp_ddp(model)\n"), out[1]
