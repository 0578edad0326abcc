"""lmscale analysis: HDF5 results files (schemas lmscale-results/1 and /2) -> Markdown/LaTeX tables and PNG plots.

Entry point: ``python3 -m analysis.report FILE.h5 [...] --out DIR`` (see docs/analysis.md).
"""
