"""/system/ranks: where each rank ran (host, device) and the library versions it used."""
from analysis.tables import Table

SECTION = "system"
JOBS = set()
RANKS = "/system/ranks"
COLUMNS = ["rank", "host", "local_rank", "device", "device_name", "mpi", "hdf5", "nccl", "cuda", "blas"]


def present(r):
    return r.has_table(RANKS)


def report(r, out, prefix):
    frame = r.tables[RANKS]
    cols = [c for c in COLUMNS if c in frame]
    t = Table(f"{r.name}: ranks", cols, numeric=[c in ("rank", "local_rank") for c in cols])
    for _, row in frame.iterrows():
        t.add(*[row[c] for c in cols])
    out.table(f"{prefix}.system", t)


def combine(results, keys, out, prefix):
    """Nothing to compare: the per-file tables say where each run ran."""
