"""Writes tables and figures under the output folder in the requested formats and remembers
what it wrote, so report.py can list it (index.md)."""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)


class Output:
    def __init__(self, folder, formats):
        self.folder = folder
        self.formats = set(formats)
        self.written = []         # file names, in order
        self.sections = []        # (heading, markdown text) for index.md
        os.makedirs(folder, exist_ok=True)

    def _write(self, name, text):
        with open(os.path.join(self.folder, name), "w", encoding="utf-8") as f:
            f.write(text)
        self.written.append(name)

    def table(self, name, table):
        """Writes NAME.md and/or NAME.tex; the Markdown also goes into index.md."""
        if "md" in self.formats:
            self._write(name + ".md", f"### {table.title}\n\n" + table.to_markdown())
        if "tex" in self.formats:
            self._write(name + ".tex", table.to_latex())
        self.sections.append((table.title, table.to_markdown()))

    def figure(self, name, fig):
        """Saves NAME.png (when png is requested) and closes the figure."""
        if "png" in self.formats:
            fig.savefig(os.path.join(self.folder, name + ".png"), dpi=120, bbox_inches="tight")
            self.written.append(name + ".png")
            self.sections.append((None, f"![{name}]({name}.png)\n"))
        plt.close(fig)

    def note(self, text):
        self.sections.append((None, text + "\n"))


def figure(ncols=1, width=6.4, height=4.0):
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


def save_loss_plot(fig, ax, title, out):
    """The studies' loss-against-tokens figures: axes labelled, legend, saved as OUT/loss.png and
    closed; returns the path."""
    ax.set_xlabel("training tokens")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = os.path.join(out, "loss.png")
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
