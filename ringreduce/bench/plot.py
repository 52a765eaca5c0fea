"""--plot FILE.png: bus bandwidth (one rank: algorithm bandwidth) against message size
(log x), one line per library and one panel per collective. matplotlib (the [bench] extra)
with the Agg backend: no display needed."""

from __future__ import annotations

from .cli import format_size
from .metrics import Row

_STYLE = {"ringreduce": ("C0", "o"), "gloo": ("C1", "s"), "mpi": ("C2", "^"),
          "nccl": ("C3", "D")}


def plot(rows: list[Row], meta: dict, path: str) -> str | None:
    """Draw the figure into `path`; returns why not, or None when the file was written."""
    try:
        import matplotlib
    except ImportError:
        return "--plot needs matplotlib: pip install matplotlib (or ringreduce[bench])"
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    ops = [op for op in meta["ops"] if op != "barrier" and any(r.op == op for r in rows)]
    if not ops:
        return "nothing to plot: barrier has no message size (use -o with another collective)"
    ncols = min(2, len(ops))
    nrows = (len(ops) + ncols - 1) // ncols
    # Constrained layout leaves room for the overall title (tight_layout put it over the top
    # panels' titles, and cut it at a single panel's edges: found by a helper).
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 4.6 * nrows), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(ops):]:
        ax.set_visible(False)
    hosts = ", ".join(f"{h} x{c}" for h, c in meta["hosts"].items())
    n = meta["world_size"]
    # One rank moves nothing between ranks: its bus bandwidth is 0 (nccl-tests' factors), which
    # a log axis cannot show (an empty plot, found by a helper): draw the algorithm bandwidth.
    bus = n > 1
    for ax, op in zip(axes.flat, ops):
        libs = list(dict.fromkeys(r.lib for r in rows if r.op == op))
        for lib in libs:
            pts = sorted((r.size, r.busbw if bus else r.algbw) for r in rows
                         if r.op == op and r.lib == lib)
            color, marker = _STYLE.get(lib, (None, "x"))
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, ms=4,
                    color=color, label=lib)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_size(int(x))))
        ax.set_xlabel("message size (bytes, nccl-tests convention)")
        ax.set_ylabel("bus bandwidth (GB/s)" if bus else
                      "algorithm bandwidth (GB/s; one rank: bus bandwidth is 0)")
        ax.set_title(f"{op}, {n} rank{'s' * (n != 1)}, {meta['dtype']}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"ringreduce-bench on {hosts}\ntransport {meta['transport']}, "
                 f"median of {meta['iters']} iterations", fontsize=10)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def replot(json_path: str, path: str) -> str | None:
    """Draw `path` from a --json file written earlier (every iteration's time is kept)."""
    import json

    with open(json_path) as f:
        data = json.load(f)
    rows = [Row.from_dict(r) for r in data["results"]]
    return plot(rows, data["meta"], path)


if __name__ == "__main__":  # python -m ringreduce.bench.plot RESULTS.json OUT.png
    import sys

    if len(sys.argv) != 3:
        sys.exit("usage: python -m ringreduce.bench.plot RESULTS.json OUT.png")
    why = replot(sys.argv[1], sys.argv[2])
    sys.exit(f"not drawn: {why}" if why else 0)
