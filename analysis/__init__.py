"""lmscale analysis: HDF5 results files (schema lmscale-results/1) -> Markdown/LaTeX tables and PNG plots.

Entry point: ``python3 -m analysis.report FILE.h5 [...] --out DIR`` (see docs/analysis.md).
"""
