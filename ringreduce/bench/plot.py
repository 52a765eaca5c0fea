"""--plot FILE.png: bus bandwidth (one rank: algorithm bandwidth) against message size
(log x), one panel per collective (per collective and reduction when --op gave several), one
line per library -- and per type when -d gave several: then the colour is the type and the
marker and line style the library, explained once in a legend beside the panels. matplotlib
(the [bench] extra) with the Agg backend: no display needed."""

from __future__ import annotations

from .cli import DTYPES, format_size
from .metrics import Row
from .outfile import save_figure

_STYLE = {"ringreduce": ("C0", "o"), "gloo": ("C1", "s"), "mpi": ("C2", "^"),
          "nccl": ("C3", "D")}
_LINE = {"ringreduce": "-", "gloo": "--", "mpi": ":", "nccl": "-."}


def panels(rows: list[Row], ops: list[str]) -> list[tuple[str, str | None]]:
    """(collective, reduction) of each panel: one per collective but barrier, split by
    reduction where its rows have several (None: one, or a collective without one)."""
    out = []
    for op in ops:
        redops = list(dict.fromkeys(r.key[2] for r in rows if r.op == op))
        out += [(op, redop if len(redops) > 1 else None) for redop in redops]
    return out


def _type_color(dtype: str) -> tuple:
    """A fixed colour per dtype, the same in every panel and run: tab20's strong shades of
    its 10 hues first, then the light ones."""
    from matplotlib import colormaps

    i = DTYPES.index(dtype) if dtype in DTYPES else len(DTYPES)
    return colormaps["tab20"].colors[(2 * i) % 20 + (2 * i) // 20 % 2]


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
    cells = panels(rows, ops)
    types = list(dict.fromkeys(r.key[1] for r in rows if r.op != "barrier"))
    by_type = len(types) > 1  # colour = type, marker and line style = library
    ncols = min(2 if len(cells) <= 4 else 3, len(cells))
    nrows = (len(cells) + ncols - 1) // ncols
    # Constrained layout leaves room for the overall title (tight_layout put it over the top
    # panels' titles, and cut it at a single panel's edges: found by a helper).
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.4 * ncols, 4.6 * nrows), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(cells):]:
        ax.set_visible(False)
    hosts = ", ".join(f"{h} x{c}" for h, c in meta["hosts"].items())
    n = meta["world_size"]
    # One rank moves nothing between ranks: its bus bandwidth is 0 (nccl-tests' factors), which
    # a log axis cannot show (an empty plot, found by a helper): draw the algorithm bandwidth.
    bus = n > 1
    libs_seen: list[str] = []
    for ax, (op, redop) in zip(axes.flat, cells):
        mine = [r for r in rows if r.op == op and (redop is None or r.key[2] == redop)]
        for lib, dtype in dict.fromkeys((r.lib, r.key[1]) for r in mine):
            pts = sorted((r.size, r.busbw if bus else r.algbw) for r in mine
                         if r.lib == lib and r.key[1] == dtype)
            color, marker = _STYLE.get(lib, (None, "x"))
            if by_type:
                color = _type_color(dtype)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, ms=4,
                    color=color, ls=_LINE.get(lib, "-") if by_type else "-",
                    label=lib if not by_type else f"{lib} {dtype}")
            libs_seen += [lib] if lib not in libs_seen else []
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_size(int(x))))
        ax.set_xlabel("message size (bytes, nccl-tests convention)")
        ax.set_ylabel("bus bandwidth (GB/s)" if bus else
                      "algorithm bandwidth (GB/s; one rank: bus bandwidth is 0)")
        what = f"{op} {redop}" if redop else op
        ax.set_title(f"{what}, {n} rank{'s' * (n != 1)}"
                     + (f", {types[0]}" if len(types) == 1 and types[0] else ""))
        ax.grid(True, which="both", alpha=0.3)
        if not by_type:
            ax.legend()
    if by_type:  # one legend for every panel: a type's colour, a library's marker and line
        from matplotlib.lines import Line2D

        handles = [Line2D([], [], color=_type_color(t), lw=2, label=t) for t in types]
        handles += [Line2D([], [], color="0.3", ls=_LINE.get(lib, "-"),
                           marker=_STYLE.get(lib, (None, "x"))[1], label=lib)
                    for lib in libs_seen]
        try:
            fig.legend(handles=handles, loc="outside right upper", fontsize=9)
        except ValueError:  # matplotlib < 3.7 has no "outside" locations
            fig.legend(handles=handles, loc="upper right", fontsize=9)
    fig.suptitle(f"ringreduce-bench on {hosts}\ntransport {meta['transport']}, "
                 f"median of {meta['iters']} iterations", fontsize=10)
    save_figure(fig, path, dpi=110)
    plt.close(fig)
    return None


def load(json_path: str) -> tuple[list[Row], dict]:
    """The rows and meta of a --json file written earlier (every iteration's time is kept)."""
    import json

    with open(json_path) as f:
        data = json.load(f)
    return [Row.from_dict(r) for r in data["results"]], data["meta"]


if __name__ == "__main__":  # python -m ringreduce.bench.plot RESULTS.json OUT.png
    import sys

    from .cli import output_problem, plot_problem

    if len(sys.argv) != 3:
        sys.exit("usage: python -m ringreduce.bench.plot RESULTS.json OUT.png")
    problem = output_problem(sys.argv[2], "OUT") or plot_problem(sys.argv[2], "OUT")
    if problem:
        sys.exit(f"error: {problem}")
    try:
        rows, meta = load(sys.argv[1])
    except (OSError, ValueError, KeyError, TypeError) as e:  # json's errors are ValueErrors
        sys.exit(f"error: {sys.argv[1]} is not a readable ringreduce-bench --json file "
                 f"({type(e).__name__}: {e})")
    try:
        why = plot(rows, meta, sys.argv[2])
    except OSError as e:
        sys.exit(f"error: cannot write {sys.argv[2]}: {e}")
    sys.exit(f"not drawn: {why}" if why else 0)
