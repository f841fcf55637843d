"""End to end on CPU: randomness that decides the data, unseeded and outside `datasets` (Python's `random`, NumPy,
torch; at the top level, inside the notebook's own function, over split cells; torch reseeded from the OS's entropy),
is the same on every rank: each rank starts from the same random state, so the ranks train and validate on the same
split. What the process sets of its own state (a recursion limit, numpy's error handling, `tqdm.pandas()`) is set on
every rank."""
from __future__ import annotations

import pytest

from e2e import assert_clean_exit, rank_records, run_notebook

pytestmark = pytest.mark.ddp

CELLS = [
    "import os, json, random\nimport numpy as np\nimport torch\nrows = list(range(40))\n",
    "random.shuffle(rows)\ntrain_rows, val_rows = rows[:30], rows[30:]\n",
    "reseeded = torch.seed()  # from the OS's entropy, in a notebook; its value is never read\n",
    "import sys\nsys.setrecursionlimit(4321)  # the process's own state: every rank's\n",
    "import pandas as pd\nfrom tqdm.auto import tqdm\ntqdm.pandas()\nnp.seterr(over='raise')  # libraries' options\n",
    "def holdout(data, k):\n    order = np.random.permutation(len(data))\n    return [int(data[i]) for i in order[:k]]\n",
    "picked = holdout(train_rows, 5)\nnoise = torch.rand(3).tolist()\nsample = random.sample(val_rows, 3)\n",
    "with open(f\"rank{os.environ.get('RANK', '0')}.json\", 'w') as fh:\n"
    "    json.dump({'val': val_rows, 'picked': picked, 'noise': noise, 'sample': sample,\n"
    "               'limit': sys.getrecursionlimit(), 'over': np.geterr()['over'],\n"
    "               'lengths': pd.Series(['ab', 'c']).progress_apply(len).tolist()}, fh)\n",
]


def _run(tmp_path, name):
    cwd = tmp_path / name
    cwd.mkdir()
    done, _ = run_notebook(CELLS, cwd)
    assert_clean_exit(done)
    return rank_records(cwd)


def test_unseeded_randomness_is_the_same_on_every_rank_and_differs_between_jobs(tmp_path):
    first, second = _run(tmp_path, "a"), _run(tmp_path, "b")
    assert first[0] == first[1] and second[0] == second[1]
    assert first[0]["limit"] == 4321 and first[0]["over"] == "raise"  # set on every rank
    assert first[0] != second[0]  # the same within a job, not a fixed seed of nbddp's
