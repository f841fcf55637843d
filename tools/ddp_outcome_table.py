"""Render the DDP outcome tables of docs/runtime.md from the runtime tests' own runs.

    python tools/ddp_outcome_table.py --run            # runs tests/test_runtime_ddp.py with NBDDP_OUTCOME_DIR set
    python tools/ddp_outcome_table.py --from DIR       # renders from JSON a previous run left in DIR

The tables replace what lies between the marker comments in docs/runtime.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "docs", "runtime.md")
BEGIN, END = "<!-- ddp-outcome-table:begin -->", "<!-- ddp-outcome-table:end -->"
SHORT = {
    "trains, same weights as one process": "trains, = 1 process",
    "trains, WRONG weights": "trains, WRONG weights",
    "error: marked ready twice": "marked ready twice",
    "error: graph has changed": "graph has changed",
    "error: unused parameter (reduction not finished)": "reduction not finished",
}
TILED = {"none": "no", "zoo": "per-chunk backward", "last-chunk": "last chunk fires hooks"}


def short(outcome: str) -> str:
    return SHORT.get(outcome, outcome)


def yes(flag) -> str:
    return "True" if flag else "False"


def render(folder: str) -> str:
    with open(os.path.join(folder, "ddp_cases_matrix.json")) as fh:
        matrix = json.load(fh)
    with open(os.path.join(folder, "ddp_cases_layer.json")) as fh:
        layer = json.load(fh)
    out = ["Without the layer (plain torch DDP, 2 processes, gloo; one LoRA-style model, 3 SGD steps, weights",
           "compared with one process on the same global batch in float64, rtol 1e-9 / atol 1e-10):", "",
           "| checkpointing | static_graph | find_unused_parameters | tiled MLP | every parameter used each step "
           "| a parameter unused in step 1 |",
           "|---|---|---|---|---|---|"]
    by = {(r["ckpt"], r["static"], r["find_unused"], r["tiled"], r["unused"]): r for r in matrix}
    for (ckpt, static, find_unused, tiled, unused), r in by.items():
        if unused:
            continue
        late = by.get((ckpt, static, find_unused, tiled, True))
        out.append(f"| {ckpt} | {yes(static)} | {yes(find_unused)} | {TILED[tiled]} | {short(r['outcome'])} "
                   f"| {short(late['outcome']) if late else '-'} |")
    out += ["", "With the layer (it picks static_graph / find_unused_parameters and patches TiledMLP; "
            "\"unused\" = the notebook set ddp_find_unused_parameters=True):", "",
            "| checkpointing | tiled MLP | parameter unused in step 1 | static_graph | find_unused_parameters "
            "| outcome |", "|---|---|---|---|---|---|"]
    for r in layer:
        ckpt = r["ckpt"] + (" -> non-reentrant + CPU offload" if r["ckpt"] in ("reentrant", "unsloth")
                            and r["unused"] else "")
        tiled = "per-chunk backward, patched" if r["tiled"] == "zoo" else "no"
        out.append(f"| {ckpt} | {tiled} | {'yes' if r['unused'] else 'no'} | {yes(r['static'])} "
                   f"| {yes(r['find_unused'])} | {short(r['outcome'])} |")
    trainer = []
    for mode in ("nolayer", "layer"):
        path = os.path.join(folder, f"trainer_{mode}.json")
        if os.path.exists(path):
            with open(path) as fh:
                trainer.append(json.load(fh))
    if trainer:
        out += ["", "transformers.Trainer + PEFT LoRA, tiny Llama, reentrant checkpointing, "
                "ddp_find_unused_parameters unset (2 processes; with the layer, NBDDP_KEEP_GLOBAL_BATCH=1 "
                "and the LoRA weights equal one process with accumulation 2 within rtol/atol 1e-5, float32):", "",
                "| nbddp layer | static_graph | find_unused_parameters | gradient_accumulation_steps | outcome |",
                "|---|---|---|---|---|"]
        for r in trainer:
            static = r["static_graph"] if r["static_graph"] is not None else "unset (False)"
            unused = r["find_unused_parameters"] if r["find_unused_parameters"] is not None \
                else "unset (transformers: True)"
            out.append(f"| {'yes' if r['mode'] == 'layer' else 'no'} | {static} | {unused} "
                       f"| {r['gradient_accumulation_steps']} | {short(r['outcome'])} |")
    return "\n".join(out)


def write(table: str, doc: str = DOC) -> None:
    with open(doc) as fh:
        text = fh.read()
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{doc} has no {BEGIN} / {END} markers; add them where the table goes")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    with open(doc, "w") as fh:
        fh.write(f"{head}{BEGIN}\n{table}\n{END}{tail}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--run", action="store_true", help="run the DDP tests and render from their results")
    group.add_argument("--from", dest="folder", help="folder of JSON results (NBDDP_OUTCOME_DIR of a test run)")
    args = parser.parse_args(argv)
    folder = args.folder
    if args.run:
        folder = tempfile.mkdtemp(prefix="nbddp-outcomes-")
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", os.path.join(ROOT, "tests", "test_runtime_ddp.py")],
                              env={**os.environ, "NBDDP_OUTCOME_DIR": folder}, cwd=ROOT)
        if done.returncode:
            print("the DDP tests failed; the table is not updated", file=sys.stderr)
            return done.returncode
    write(render(folder))
    print(f"updated {DOC} from {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
