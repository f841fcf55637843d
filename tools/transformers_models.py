"""Writes nbddp/data/transformers_models.txt: the model classes of the installed transformers (its AutoModel* classes
and every class its auto mappings name), the table nbddp.entries reads to know a model load by qualified name.

    python tools/transformers_models.py
"""
from pathlib import Path

import transformers
from transformers.models.auto import modeling_auto


def model_classes() -> list[str]:
    found = {name for name in dir(modeling_auto) if name.startswith("AutoModel")}
    tables = [n for n in dir(modeling_auto) if n.startswith("MODEL_") and n.endswith("MAPPING_NAMES")]
    for table in (getattr(modeling_auto, n) for n in tables):
        for value in table.values():
            found.update([value] if isinstance(value, str) else value)
    return sorted(name for name in found if hasattr(transformers, name))


if __name__ == "__main__":
    out = Path(__file__).resolve().parents[1] / "nbddp" / "data" / "transformers_models.txt"
    names = model_classes()
    out.write_text(f"# transformers {transformers.__version__}: its model classes (tools/transformers_models.py)\n"
                   + "\n".join(names) + "\n", encoding="utf-8")
    print(f"{len(names)} classes -> {out}")
