"""`jupyter nbconvert --to ddp notebook.ipynb`: the nbconvert face of `nbddp convert` (same pipeline, same script)."""
from __future__ import annotations

from nbconvert.exporters import Exporter
from traitlets import Bool, Integer


class DDPExporter(Exporter):
    """Writes the torchrun-ready DDP script nbddp makes from a notebook."""

    export_from_notebook = "DDP script (nbddp)"
    output_mimetype = "text/x-python"

    nproc = Integer(2, help="processes (GPUs) in the launch commands the script's header prints").tag(config=True)
    scale_batch = Bool(False, help="N times the notebook's samples per step on N processes (default: its batch kept "
                                   "where N divides gradient_accumulation_steps)").tag(config=True)

    def _file_extension_default(self):
        return ".py"

    def from_notebook_node(self, nb, resources=None, **kw):
        from .pipeline import convert_notebook
        from .transforms.base import Options

        nb_copy, resources = super().from_notebook_node(nb, resources, **kw)
        name = resources.get("metadata", {}).get("name") or "notebook"
        result = convert_notebook(
            nb_copy, source_name=f"{name}.ipynb", script_name=f"{name}{self.file_extension}", nproc=self.nproc,
            options=Options(scale_batch=self.scale_batch),
        )
        resources["output_extension"] = self.file_extension
        resources["nbddp_report"] = result.report.format(result.launch)
        self.log.info("%s", resources["nbddp_report"])
        return result.script, resources
