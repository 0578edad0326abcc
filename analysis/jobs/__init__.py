"""One module per section of a results file. Each has:

- ``SECTION``: name used in output files; ``JOBS``: the run.job values it belongs to (empty: any job)
- ``present(results)``: whether the file holds data for it
- ``report(results, out, prefix)``: tables and plots of one file
- ``combine(results_list, keys, out, prefix)``: one comparison across several files of a job;
  ``keys`` are the configuration keys that differ between the files (analysis/compare.py)
"""
from analysis.jobs import (accounting, bench_attention, bench_collectives, bench_gemm, bench_model, memory, pipeline, prune,
                           system, train)

MODULES = [system, train, bench_model, pipeline, bench_attention, bench_gemm, bench_collectives, memory, prune,
           accounting]
KNOWN_JOBS = {job for m in MODULES for job in m.JOBS}
