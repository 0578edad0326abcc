"""A small table type rendered as Markdown (pipe table) and LaTeX (booktabs tabular).

Cells are strings already formatted by the job modules (see ``num``), so both renderings show
exactly the same digits.
"""
import math
from dataclasses import dataclass, field


def num(value, spec=".3f"):
    """Formats a number for a table cell; None -> "", NaN -> "n/a", strings pass through."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    return format(value, spec)


def mib(nbytes):
    """Bytes -> MiB with one decimal."""
    return num(None if nbytes is None else nbytes / 2**20, ".1f")


def mean_std(mean, std, spec=".3f"):
    return f"{num(mean, spec)} ± {num(std, spec)}"


def header(name, unit=""):
    return f"{name} ({unit})" if unit else name


@dataclass
class Table:
    title: str
    columns: list                      # header strings
    rows: list = field(default_factory=list)   # lists of cell strings
    numeric: list = None               # per column: right-align (default: all but the first)

    def add(self, *cells):
        self.rows.append([str(c) for c in cells])

    def _numeric(self):
        return self.numeric if self.numeric is not None else [i > 0 for i in range(len(self.columns))]

    def to_markdown(self):
        def line(cells):
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"
        rule = ["---:" if n else ":---" for n in self._numeric()]
        return "\n".join([line(self.columns), "|" + "|".join(rule) + "|"] + [line(r) for r in self.rows]) + "\n"

    def to_latex(self):
        spec = "".join("r" if n else "l" for n in self._numeric())
        out = [f"% {latex_escape(self.title)}", f"\\begin{{tabular}}{{{spec}}}", "\\toprule",
               " & ".join(latex_escape(c) for c in self.columns) + " \\\\", "\\midrule"]
        out += [" & ".join(latex_escape(c) for c in r) + " \\\\" for r in self.rows]
        out += ["\\bottomrule", "\\end{tabular}"]
        return "\n".join(out) + "\n"


_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
          "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "±": r"$\pm$"}


def latex_escape(text):
    return "".join(_LATEX.get(ch, ch) for ch in str(text))
