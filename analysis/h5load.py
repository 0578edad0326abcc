"""Loads one lmscale results file (schemas lmscale-results/1 and /2, docs/hdf5.md) into plain Python.

A file becomes a ``Results``: root attributes, the resolved configuration parsed from the root
attribute ``config`` (INI text) into ``{"section.key": "value"}``, every 1-D compound dataset as a
pandas DataFrame (string columns as ``str``), each table's units, the attributes of every group
and the units of the numeric ones. Missing pieces are simply absent: callers check ``has_table``
and skip what is not there.

Schema 1 files (lmscale before the variable-length strings) are read into the same shape as
schema 2 ones: their 0-based step columns (``/train/steps``, ``/bench_model/steps``,
``/pipeline/events``) are counted from 1, the unit ``1/s`` of ``tokens_per_s`` becomes
``tokens/s``, and attribute units, which schema 1 did not store, are empty.
"""
import configparser
import json
import os
from dataclasses import dataclass, field

import h5py
import numpy as np
import pandas as pd

SCHEMA = "lmscale-results/2"
SCHEMAS = ("lmscale-results/1", SCHEMA)   # what load() reads
# Tables whose `step` column schema 1 counted from 0.
ZERO_BASED_STEPS = ("/train/steps", "/bench_model/steps", "/pipeline/events")


def file_kind(path):
    """"results" for a results file this module reads (root attribute `schema` in SCHEMAS), else what
    the file is, in words: "weights or checkpoint, schema lmscale-checkpoint/1", "schema X",
    "no lmscale schema", "a trace", "safetensors weights", "not HDF5"."""
    if path.endswith(".safetensors"):
        return "safetensors weights"
    if not h5py.is_hdf5(path):
        with open(path, "rb") as f:
            head = f.read(16)
        return "a trace" if head.startswith(b'{"traceEvents"') or head[:2] == b"\x1f\x8b" else "not HDF5"
    with h5py.File(path, "r") as f:
        schema = decode(f.attrs.get("schema", ""))
    if schema in SCHEMAS:
        return "results"
    if schema.startswith("lmscale-checkpoint"):
        return f"weights or checkpoint, schema {schema}"
    return f"schema {schema}" if schema else "no lmscale schema"


def decode(value):
    """HDF5 attribute or cell -> plain Python (bytes -> str, numpy scalars -> int/float, arrays -> lists)."""
    if isinstance(value, (bytes, np.bytes_)):
        return value.decode("utf-8", "replace").rstrip("\0")
    if isinstance(value, np.ndarray):
        return [decode(v) for v in value.tolist()] if value.ndim else decode(value[()])
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list):
        return [decode(v) for v in value]
    return value


def parse_config(text):
    """Resolved INI text -> {"section.key": value}. Empty or unparsable text gives {}."""
    if not text:
        return {}
    parser = configparser.RawConfigParser(strict=False)
    parser.optionxform = str  # keys are case-sensitive names
    try:
        parser.read_string(text)
    except configparser.Error:
        return {}
    return {f"{s}.{k}": v.strip() for s in parser.sections() for k, v in parser.items(s)}


def frame(dataset):
    """A table (1-D compound dataset, h5py) -> pandas DataFrame with string columns as ``str``.

    h5py returns the string fields of compound datasets as ``bytes`` whatever their HDF5 string
    type; this turns them into ``str`` (UTF-8) so that the frame can be grouped and printed."""
    data = dataset[()]
    frame = pd.DataFrame({name: data[name] for name in data.dtype.names})
    for name in data.dtype.names:
        kind = data.dtype[name].kind
        if kind in ("S", "O", "U"):
            frame[name] = [decode(v) for v in frame[name]]
    return frame


@dataclass
class Results:
    path: str
    attrs: dict = field(default_factory=dict)        # root attributes
    config: dict = field(default_factory=dict)       # "section.key" -> value (strings)
    tables: dict = field(default_factory=dict)       # "/train/steps" -> DataFrame
    units: dict = field(default_factory=dict)        # "/train/steps" -> {column: unit}
    groups: dict = field(default_factory=dict)       # "/train" (or a table) -> {attribute: value}
    attr_units: dict = field(default_factory=dict)   # "/train" -> {numeric attribute: unit}

    @property
    def name(self):
        return os.path.splitext(os.path.basename(self.path))[0]

    @property
    def job(self):
        """Root attribute `job`, else run.job of the resolved configuration, else guessed from the groups."""
        job = self.attrs.get("job") or self.config.get("run.job")
        if job:
            return job
        for group, guess in (("/train", "train"), ("/bench_model", "bench-model"),
                             ("/bench_attention", "bench-attention"),
                             ("/bench_collectives", "bench-collectives"), ("/accounting", "accounting")):
            if group in self.groups:
                return guess
        return "unknown"

    def has_table(self, path):
        return path in self.tables and len(self.tables[path]) > 0

    def group_attrs(self, group):
        return self.groups.get(group, {})

    def unit(self, table, column):
        return self.units.get(table, {}).get(column, "")

    def attr_unit(self, group, attribute):
        """Unit of a numeric attribute ("" when none or when the file is of schema 1)."""
        return self.attr_units.get(group, {}).get(attribute, "")


def _attributes(obj):
    """(attributes without `attribute_units` and a table's `units`, {attribute: unit} parsed from it)."""
    attrs = {k: decode(v) for k, v in obj.attrs.items()
             if k != "attribute_units" and not (k == "units" and isinstance(obj, h5py.Dataset))}
    units = json.loads(decode(obj.attrs["attribute_units"])) if "attribute_units" in obj.attrs else {}
    return attrs, units


def _upgrade_schema_1(res):
    """Schema 1 -> the shape of schema 2: steps from 1, tokens/s as the throughput unit."""
    for path in ZERO_BASED_STEPS:
        if path in res.tables and "step" in res.tables[path]:
            res.tables[path]["step"] = res.tables[path]["step"] + 1
    for units in res.units.values():
        if units.get("tokens_per_s") == "1/s":
            units["tokens_per_s"] = "tokens/s"


def load(path):
    """Opens `path` read-only and returns its Results; raises OSError if it is not HDF5."""
    res = Results(path=path)
    with h5py.File(path, "r") as f:
        res.attrs, res.attr_units["/"] = _attributes(f)
        res.config = parse_config(res.attrs.get("config", ""))
        res.groups["/"] = res.attrs

        def visit(name, obj):
            full = "/" + name
            if isinstance(obj, h5py.Group):
                res.groups[full], res.attr_units[full] = _attributes(obj)
            elif isinstance(obj, h5py.Dataset) and obj.dtype.names and obj.ndim == 1:
                res.tables[full] = frame(obj)
                res.groups[full], res.attr_units[full] = _attributes(obj)   # a table's own attributes
                units = decode(obj.attrs["units"]) if "units" in obj.attrs else []
                if isinstance(units, str):
                    units = [units]
                res.units[full] = dict(zip(obj.dtype.names, units))

        f.visititems(visit)
    if res.attrs.get("schema") == "lmscale-results/1":
        _upgrade_schema_1(res)
    return res
