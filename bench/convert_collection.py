#!/usr/bin/env python3
"""Convert every notebook in a folder (Unsloth's whole collection: the `nb/` folder of unslothai/notebooks) and say
how many convert, which fail and why, and the report's most frequent warnings; CPU only, nothing runs.

    python bench/convert_collection.py FOLDER [--out RESULT.json]
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # nbddp from this checkout


def main(argv=None):
    from nbddp.errors import NbddpError
    from nbddp.pipeline import convert_notebook

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    paths = sorted(glob.glob(os.path.join(args.folder, "*.ipynb")))
    result = {"total": len(paths), "converted": 0, "failed": {}, "warnings": collections.Counter()}
    start = time.perf_counter()
    for path in paths:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # nbformat's own housekeeping
                conversion = convert_notebook(path)
        except NbddpError as exc:
            result["failed"][os.path.basename(path)] = str(exc)
            continue
        except Exception as exc:  # a bug: counted, named, and the run goes on
            result["failed"][os.path.basename(path)] = f"crash: {type(exc).__name__}: {exc}"
            continue
        result["converted"] += 1
        result["warnings"].update(note.text.split(":")[0][:70] for note in conversion.report.warnings)
    result["seconds"] = round(time.perf_counter() - start, 1)
    result["warnings"] = dict(result["warnings"].most_common(20))
    print(f"{result['converted']}/{result['total']} converted in {result['seconds']} s")
    for name, why in result["failed"].items():
        print(f"  {name}: {why}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
    return 0 if not result["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
