"""Test helpers: read back the pipe tables analysis.report writes, and check PNG files."""
import os
import struct
import sys


def read_table(path):
    """The first Markdown pipe table in `path` -> (header list, rows as dicts header -> cell)."""
    with open(path, encoding="utf-8") as f:
        lines = [l.rstrip("\n") for l in f if l.startswith("|")]
    if len(lines) < 2:
        raise AssertionError(f"{path}: no Markdown table")

    def cells(line):
        return [c.strip() for c in line.strip().strip("|").split(" | ")]
    head = cells(lines[0])
    rows = [dict(zip(head, cells(l))) for l in lines[2:]]
    return head, rows


def find_row(rows, **match):
    """The one row whose cells equal `match` (keys with spaces: pass a dict via **)."""
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    if len(found) != 1:
        raise AssertionError(f"expected one row with {match}, found {len(found)} in {rows}")
    return found[0]


def check_png(path):
    """A real PNG: signature, an IHDR chunk with nonzero width and height."""
    with open(path, "rb") as f:
        head = f.read(24)
    if os.path.getsize(path) < 100 or head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        raise AssertionError(f"{path}: not a PNG")
    width, height = struct.unpack(">II", head[16:24])
    if width == 0 or height == 0:
        raise AssertionError(f"{path}: empty image")


def require_modules():
    """Exit 77 (ctest: skipped) when the analysis packages are missing, unless
    LMSCALE_REQUIRE_ANALYSIS is set (then a missing package is a failure)."""
    try:
        import h5py, pandas, matplotlib  # noqa: F401,E401
    except ImportError as e:
        if os.environ.get("LMSCALE_REQUIRE_ANALYSIS"):
            print(f"FAIL: {e} (LMSCALE_REQUIRE_ANALYSIS is set)")
            sys.exit(1)
        print(f"SKIP: {e}; install analysis/requirements.txt (make deps)")
        sys.exit(77)


class Checker:
    """Collects failures so one run reports all of them."""

    def __init__(self):
        self.failures = 0

    def eq(self, what, got, want):
        if got != want:
            print(f"FAIL {what}: got {got!r}, want {want!r}")
            self.failures += 1

    def true(self, what, cond):
        if not cond:
            print(f"FAIL {what}")
            self.failures += 1

    def run(self, what, fn, *args):
        try:
            fn(*args)
        except (AssertionError, OSError, KeyError) as e:
            print(f"FAIL {what}: {type(e).__name__}: {e}")
            self.failures += 1

    def exit(self):
        print("FAILED" if self.failures else "OK", f"({self.failures} failures)")
        sys.exit(1 if self.failures else 0)
