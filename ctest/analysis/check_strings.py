#!/usr/bin/env python3
"""check_strings.py FILE.h5 ...: results files of schema lmscale-results/2 (written by lmscale)
hold every string as variable-length UTF-8 and give every numeric attribute and column a unit:

- every string field of every table is a variable-length UTF-8 string (not a fixed-length one);
- analysis.h5load.frame reads every table to a DataFrame whose object columns hold only `str`,
  and no cell ends in NUL padding;
- every table has `units` (str, one per column) and every object with numeric attributes has
  `attribute_units` (JSON) naming each of them, with units from docs/hdf5.md's vocabulary;
- steps count from 1 in /train/steps and /bench_model/steps, and /train/eval's steps are steps of
  /train/steps (the same numbering).
Exit 0 when all hold, 1 otherwise (each failure printed)."""
import json
import os
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from analysis import h5load  # noqa: E402

# docs/hdf5.md "Units"
UNITS = {"", "s", "ms", "us", "h", "bytes", "MiB", "GB/s", "bytes/s", "tokens/s", "FLOP", "FLOP/s", "TFLOP/s",
         "nats", "nats/byte", "tokens", "sequences", "elements", "calls", "bool", "currency", "currency/h"}


def main(paths):
    failures = []
    fail = failures.append
    for path in paths:
        with h5py.File(path, "r") as f:
            if f.attrs.get("schema") != "lmscale-results/2":
                fail(f"{path}: schema {f.attrs.get('schema')!r}")
            objects = {"/": f}
            f.visititems(lambda name, obj: objects.__setitem__("/" + name, obj))
            tables = 0
            for name, obj in objects.items():
                numeric = [k for k, v in obj.attrs.items()
                           if k != "attribute_units" and np.asarray(v).dtype.kind in "iuf"]
                if numeric:
                    if "attribute_units" not in obj.attrs:
                        fail(f"{path}:{name}: numeric attributes {numeric} but no attribute_units")
                    else:
                        units = json.loads(obj.attrs["attribute_units"])
                        for k in numeric:
                            if k not in units:
                                fail(f"{path}:{name}: attribute {k} has no unit")
                        for k, u in units.items():
                            if u not in UNITS:
                                fail(f"{path}:{name}: attribute {k} has unit {u!r}, not one of docs/hdf5.md's")
                if not (isinstance(obj, h5py.Dataset) and obj.dtype.names):
                    continue
                tables += 1
                for field in obj.dtype.names:
                    base = obj.dtype.fields[field][0]
                    info = h5py.check_string_dtype(base)
                    if base.kind in "SO" and (info is None or info.length is not None or info.encoding != "utf-8"):
                        fail(f"{path}:{name}: column {field} is {base}, not a variable-length UTF-8 string")
                units = list(obj.attrs.get("units", []))
                if len(units) != len(obj.dtype.names) or not all(isinstance(u, str) for u in units):
                    fail(f"{path}:{name}: units {units!r} are not one str per column")
                for u in units:
                    if u not in UNITS:
                        fail(f"{path}:{name}: column unit {u!r} is not one of docs/hdf5.md's")
                frame = h5load.frame(obj)
                for column in frame.columns:
                    if frame[column].dtype == object:
                        kinds = {type(v) for v in frame[column]}
                        if kinds - {str}:
                            fail(f"{path}:{name}: column {column} holds {kinds}")
                        if any(v.endswith("\0") for v in frame[column]):
                            fail(f"{path}:{name}: column {column} has NUL padding")
                if name in ("/train/steps", "/bench_model/steps") and len(obj) and obj["step"][0] != 1:
                    fail(f"{path}:{name}: steps start at {obj['step'][0]}, not 1")
                if name == "/train/eval" and "/train/steps" in f:
                    logged = set(f["/train/steps"]["step"].tolist())
                    if not set(obj["step"].tolist()) <= logged:
                        fail(f"{path}:{name}: eval steps {obj['step'][:]} are not steps of /train/steps")
            print(f"{path}: {tables} tables, {len(objects)} objects checked")
    for line in failures:
        print("FAIL", line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
