"""Loads one lmscale results file (schema lmscale-results/1, docs/hdf5.md) into plain Python.

A file becomes a ``Results``: root attributes, the resolved configuration parsed from the root
attribute ``config`` (INI text) into ``{"section.key": "value"}``, every 1-D compound dataset as a
pandas DataFrame (strings decoded), each table's units, and the attributes of every group.
Missing pieces are simply absent: callers check ``has_table`` and skip what is not there.
"""
import configparser
import os
from dataclasses import dataclass, field

import h5py
import numpy as np
import pandas as pd

SCHEMA = "lmscale-results/1"


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


def _table(dataset):
    """1-D compound dataset -> DataFrame with string columns decoded."""
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
    groups: dict = field(default_factory=dict)       # "/train" -> {attribute: value}

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


def load(path):
    """Opens `path` read-only and returns its Results; raises OSError if it is not HDF5."""
    res = Results(path=path)
    with h5py.File(path, "r") as f:
        res.attrs = {k: decode(v) for k, v in f.attrs.items()}
        res.config = parse_config(res.attrs.get("config", ""))
        res.groups["/"] = res.attrs

        def visit(name, obj):
            full = "/" + name
            if isinstance(obj, h5py.Group):
                res.groups[full] = {k: decode(v) for k, v in obj.attrs.items()}
            elif isinstance(obj, h5py.Dataset) and obj.dtype.names and obj.ndim == 1:
                res.tables[full] = _table(obj)
                units = decode(obj.attrs["units"]) if "units" in obj.attrs else []
                if isinstance(units, str):
                    units = [units]
                res.units[full] = dict(zip(obj.dtype.names, units))

        f.visititems(visit)
    return res
