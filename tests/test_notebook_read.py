"""Reading notebooks: every form the API accepts, older formats upgraded, and one-line errors for the rest."""
from __future__ import annotations

import json

import nbformat
import pytest

from conftest import make_notebook
from nbddp.errors import NbddpError, NotebookReadError
from nbddp.notebook import as_notebook, notebook_from_bytes, read_notebook


def _sources(nb):
    return [c.source for c in nb.cells]


def test_every_accepted_form_reads_the_same(tmp_path):
    nb = make_notebook("x = 1\n", ("markdown", "m"), "y = 2\n")
    path = tmp_path / "n.ipynb"
    text = json.dumps(nb)
    path.write_text(text)
    expected = ["x = 1\n", "m", "y = 2\n"]
    for form in (path, str(path), text, text.encode(), dict(json.loads(text)), nb):
        assert _sources(as_notebook(form)) == expected, type(form)


def test_v4_minor_with_cell_ids_is_read_as_current():
    nb = make_notebook("x = 1\n")
    data = json.loads(json.dumps(nb))
    data["nbformat_minor"] = 2  # ids are only valid from 4.5; notebooks in the wild have both
    read = notebook_from_bytes(json.dumps(data).encode())
    assert read.nbformat_minor == nbformat.current_nbformat_minor and _sources(read) == ["x = 1\n"]


def test_v3_notebook_is_upgraded():
    v3 = {"nbformat": 3, "nbformat_minor": 0, "metadata": {},
          "worksheets": [{"cells": [{"cell_type": "code", "input": "x = 1", "language": "python",
                                      "outputs": [], "metadata": {}}], "metadata": {}}]}
    read = notebook_from_bytes(json.dumps(v3).encode())
    assert read.nbformat == 4 and _sources(read) == ["x = 1"]


@pytest.mark.parametrize("raw, mention", [
    (b"", "is empty"),
    (b"   \n", "is empty"),
    (b"not json", "not valid JSON"),
    (b'{"cells": [', "not valid JSON"),
    (b"[1, 2]", "not a Jupyter notebook"),
    (b'"a string"', "not a Jupyter notebook"),
    (b'{"metadata": {}}', "not a Jupyter notebook"),
    (b'{"cells": "nope", "nbformat": 4, "nbformat_minor": 5, "metadata": {}}', "not a valid notebook"),
    (bytes(range(256)), "not a text file"),
])
def test_bad_bytes_give_one_line_errors(raw, mention):
    with pytest.raises(NotebookReadError) as err:
        notebook_from_bytes(raw, name="bad.ipynb")
    message = str(err.value)
    assert mention in message and message.startswith("bad.ipynb") and "\n" not in message


def test_paths_that_are_not_notebook_files(tmp_path):
    with pytest.raises(NotebookReadError, match="no such file"):
        read_notebook(str(tmp_path / "missing.ipynb"))
    with pytest.raises(NotebookReadError, match="is a directory"):
        read_notebook(str(tmp_path))


def test_unsupported_python_object():
    with pytest.raises(NbddpError, match="cannot read a notebook from int"):
        as_notebook(42)


def test_notebook_without_code_cells_is_an_error():
    import nbddp

    with pytest.raises(NotebookReadError, match="no code cells"):
        nbddp.convert(make_notebook(("markdown", "just text"), "  \n"))


def test_outputs_with_properties_the_schema_forbids_are_repaired():
    nb = make_notebook("x = 1\n")
    data = json.loads(json.dumps(nb))
    data["cells"][0]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "hi\n", "metadata": {}},
                                   {"output_type": "display_data", "data": {}, "metadata": {}}]
    read = notebook_from_bytes(json.dumps(data).encode())
    nbformat.validate(read)
    assert read.cells[0].outputs[0] == {"output_type": "stream", "name": "stdout", "text": "hi\n"}
    assert read.cells[0].outputs[1] == {"output_type": "display_data", "data": {}, "metadata": {}}  # allowed there
    notes = read.metadata["nbddp"]["read_notes"]
    assert notes == ["cell 1 (code): dropped metadata of a stream output, which nbformat's schema does not allow "
                     "there"]
