"""End to end on CPU, 2 ranks: a demo server (gradio) that the notebook launches after training. In a notebook its
`launch()` returns at once (it sees IPython); in a script it would block for good. The converted script's launch
returns as in the notebook, the rest of the notebook runs, and the job ends with the demo (issue 49). gradio is not
among the test extras (its install is large): the test runs where it is installed."""
from __future__ import annotations

import pytest

from e2e import assert_clean_exit, run_notebook

pytestmark = pytest.mark.ddp
gradio = pytest.importorskip("gradio", reason="gradio is not installed here (pip install gradio runs this test)")

CELLS = [
    "import torch\nimport gradio as gr\n",
    "torch.manual_seed(0)\nmodel = torch.nn.Linear(2, 1)\nopt = torch.optim.SGD(model.parameters(), lr = 0.1)\n"
    "loader = torch.utils.data.DataLoader(torch.randn(8, 2), batch_size = 2)\n"
    "for batch in loader:\n    loss = model(batch).pow(2).mean()\n    loss.backward()\n    opt.step()\n"
    "    opt.zero_grad()\n",
    "def reply(text):\n    return text.upper()\n"
    "demo = gr.Interface(fn = reply, inputs = 'text', outputs = 'text')\n",
    "def serve(app):\n    app.launch(server_name = '127.0.0.1')\nserve(demo)\n",
    "print('AFTER THE DEMO', flush = True)\n",
]


def test_a_demo_launched_after_training_returns_and_the_job_ends_with_it(tmp_path):
    job, conversion = run_notebook(CELLS, tmp_path, timeout=120, env={"GRADIO_ANALYTICS_ENABLED": "False"})
    assert_clean_exit(job)
    assert job.count("AFTER THE DEMO") == 1, job.explain()  # the cell after the launch ran, on rank 0
    assert "prevent_thread_lock = True" in conversion.script  # as the notebook spaces its keywords
    assert "the demo runs until the script ends, then stops with it" in conversion.report.format()
    assert job.seconds < 100, job.explain()
