"""Command line of ringreduce-bench: options in the spirit of nccl-tests, size parsing and the
size sweep. Pure functions, no I/O, so tests can cover them without starting ranks."""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable, Sequence

from .. import _C
from .machine import available_bytes

PROG = "ringreduce-bench"
OPS = ("allreduce", "broadcast", "allgather", "reduce_scatter", "barrier", "reduce", "gather",
       "scatter", "alltoall")
REDOPS = ("sum", "avg", "prod", "min", "max")
DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "uint8", "int16", "uint16", "int32",
          "uint32", "int64", "uint64")
ANCHORS = ("gloo", "mpi", "nccl")
_DTYPE_ALIASES = {"float": "float32", "double": "float64", "half": "float16", "bf16": "bfloat16",
                  "fp32": "float32", "fp64": "float64", "fp16": "float16", "int": "int32",
                  "char": "int8", "long": "int64"}
_OP_ALIASES = {"all_reduce": "allreduce", "all_gather": "allgather", "bcast": "broadcast",
               "reducescatter": "reduce_scatter", "reduce-scatter": "reduce_scatter",
               "all_to_all": "alltoall", "all-to-all": "alltoall"}
_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from "8", "64K", "256M", "1G", "1.5M", "64KiB", "4kb" (suffixes are powers of
    1024, as in nccl-tests)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError(f"{text!r} is not a size; write a number of bytes with an optional "
                         "K, M, G or T suffix, e.g. 8, 64K, 256M, 1G")
    value = float(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if value != int(value):
        raise ValueError(f"{text!r} is not a whole number of bytes")
    return int(value)


def format_size(n: int) -> str:
    """Short human form of a byte count: 8B, 64K, 1M, 1.5M."""
    for unit, scale in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.3g}{unit}"
    return f"{n}B"


MAX_SIZES = 4096  # a sweep's sizes (each is -w + -n iterations of every case)


def size_sweep(begin: int, end: int, factor: float = 2.0, step: int = 0) -> list[int]:
    """Sizes from begin to end (inclusive), multiplying by `factor`, or adding `step` bytes
    when step > 0 (nccl-tests' -f / --stepbytes)."""
    if begin < 0 or end < begin:
        raise ValueError(f"need 0 <= minbytes <= maxbytes, got -b {begin} -e {end}")
    if step <= 0 and not 1 < factor < math.inf:  # also refuses nan
        raise ValueError(f"-f must be a finite number > 1 (got {factor}), or give --stepbytes")
    if step <= 0 and begin == 0:
        raise ValueError("-b 0 with -f would never grow; start at 1 byte or more")
    if step > 0 and (end - begin) // step >= MAX_SIZES:  # before a list of millions is built
        raise ValueError(f"-b {format_size(begin)} -e {format_size(end)} --stepbytes {step} makes "
                         f"{(end - begin) // step + 1} sizes (at most {MAX_SIZES}); raise "
                         f"--stepbytes or narrow -b/-e")
    sizes, s = [], begin
    while s <= end:
        if len(sizes) == MAX_SIZES:
            raise ValueError(f"-b {format_size(begin)} -e {format_size(end)} -f {factor:g} makes "
                             f"more than {MAX_SIZES} "
                             f"sizes; raise -f or narrow -b/-e")
        sizes.append(s)
        nxt = s + step if step > 0 else int(s * factor)
        s = nxt if nxt > s else s + 1
    return sizes


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _whole(low: int, need: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"got {v}; need {need}")
        return v
    return parse


_positive = _whole(1, "at least 1")
_nonneg = _whole(0, "0 or more")


def _finite(low: float, strict: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(v) or v < low or (strict and v == low):
            raise argparse.ArgumentTypeError(
                f"got {text}; need a finite number {'>' if strict else '>='} {low:g}")
        return v
    return parse


def _names(text: str, opt: str, what: str, names: Sequence[str], aliases: dict,
           hint: Callable[[str], str]) -> list[str]:
    """A comma-separated list of `names` (aliases allowed; "all": every one) given to
    option `opt`, duplicates dropped; `hint(word)` says more about a word that is none."""
    out: list[str] = []
    for word in text.lower().split(","):
        word = aliases.get(word.strip(), word.strip())
        if not word:
            raise argparse.ArgumentTypeError(f"empty item in {opt} {text!r}")
        if word == "all":
            out.extend(names)
        elif word in names:
            out.append(word)
        else:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {word!r}; use one of {', '.join(names)} or all "
                f"(comma-separated){hint(word)}")
    return list(dict.fromkeys(out))


def _ops(text: str) -> list[str]:
    return _names(text, "-o", "operation", OPS, _OP_ALIASES, lambda w: (
        f" (-o picks the collective here; the reduction is --op {w}, which nccl-tests "
        "spells -o)") if w in REDOPS else "")


def _checks(text: str) -> int:
    """-c N: iterations whose results are verified, after the timed ones (nccl-tests')."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"got {text!r}; -c takes a number of checked "
                                         f"iterations (0: none; nothing: 1)") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"got {v}; -c takes 0 or more")
    return v


def _iters(text: str) -> int:
    """-i: timed iterations (nccl-tests' -i is a step in bytes: a size is told so)."""
    m = _SIZE_RE.match(text)
    if m and (m.group(2) or m.group(3)):
        raise argparse.ArgumentTypeError(
            f"got {text!r}: -i is the number of timed iterations here (nccl-tests' -n); "
            f"nccl-tests' -i, a step in bytes, is --stepbytes {text}")
    return _positive(text)


# nccl-tests' options that have no counterpart here: what each is, and what to do instead.
_NCCL_TESTS_ONLY = {
    "-g": "GPUs per thread: one rank here has one device; -n sets the ranks (--device cuda)",
    "-t": "threads per process: each rank is a process here; -n sets the ranks",
    "-z": "blocking collectives: the timed calls are blocking here already; drop it",
    "-a": ("how to combine the ranks' times: the time here is always the median of the "
           "slowest rank's; drop it"),
    "-G": "CUDA graph launches: not supported; drop it",
    "-R": "user buffer registration: not supported (ringreduce registers its own); drop it",
    "-m": "aggregated iterations: not supported; drop it",
    "-p": "parallel init: not needed; drop it",
    "-N": "run cycles: not supported; run the command again",
    "-F": "the CSV output: use --csv FILE",
    "-T": "a timeout: use --timeout SECONDS",
    "-M": "message size for the device memory: not supported; drop it",
}


def _nccl_tests_habit(argv: Sequence[str]) -> str | None:
    """The message for the first of nccl-tests' options without a counterpart in argv."""
    for word in argv:  # (argparse takes no value starting with "-" but as --opt=value)
        name = word[:2]
        if name in _NCCL_TESTS_ONLY and (len(word) == 2 or word[2:].lstrip("=").isdigit()):
            return f"{name} is nccl-tests' {_NCCL_TESTS_ONLY[name]}"
    return None


def _available(name: str) -> bool:
    """Whether this torch has dtype `name` (uint16/32/64 came with torch 2.3)."""
    if not name.startswith("uint") or name == "uint8":
        return True
    import torch

    return hasattr(torch, name)


def _dtypes(text: str) -> list[str]:
    """-d: one dtype, a comma-separated list, or all (every DTYPES entry this torch has)."""
    out: list[str] = []
    for word in text.lower().split(","):
        word = word.strip()
        name = _DTYPE_ALIASES.get(word, word)
        if not word:
            raise argparse.ArgumentTypeError(f"empty item in -d {text!r}")
        if name == "all":
            out.extend(n for n in DTYPES if _available(n))
        elif name not in DTYPES:
            raise argparse.ArgumentTypeError(
                f"unknown dtype {word!r}; use one of {', '.join(DTYPES)} or all "
                "(comma-separated)")
        elif not _available(name):
            import torch

            raise argparse.ArgumentTypeError(f"{name} needs torch >= 2.3 (this is torch "
                                             f"{torch.__version__})")
        else:
            out.append(name)
    return list(dict.fromkeys(out))


def _redops(text: str) -> list[str]:
    """--op: one reduction, a comma-separated list, or all (every REDOPS entry)."""
    return _names(text, "--op", "reduction", REDOPS, {}, lambda w: (
        f" (--op picks the reduction; the collective is -o {w})"
        if _OP_ALIASES.get(w, w) in OPS else ""))


def several_types(args: argparse.Namespace) -> bool:
    """Whether -d or --op named several values (a list or all): a combination ringreduce
    refuses is then a recorded skip, not the end of the run."""
    return len(args.dtypes) > 1 or len(args.redops) > 1


def _anchors(text: str) -> list[str]:
    names = [w.strip().lower() for w in text.split(",") if w.strip()]
    bad = [w for w in names if w not in ANCHORS]
    if bad:
        raise argparse.ArgumentTypeError(
            f"unknown library {bad[0]!r} for --compare; use {' or '.join(ANCHORS)} "
            "(comma-separated)")
    return list(dict.fromkeys(names))


def _int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers >= 1, got {text!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Microbenchmark ringreduce collectives (nccl-tests conventions), optionally "
                    "side by side with torch.distributed gloo and Open MPI.",
        epilog="examples:\n"
               "  ringreduce-bench -n 2 -b 8 -e 64M -f 2 --compare gloo --plot bw.png\n"
               "  ringreduce-bench -n 4 -o all -d bfloat16 --check\n"
               "  ringreduce-bench -n 2 -o allreduce,broadcast -d all --op all --check\n"
               "  torchrun --nproc-per-node 8 -m ringreduce.bench -b 1K -e 1G\n"
               "  ringreduce-bench --tune --tune-out tuning.json   # then RINGREDUCE_TUNING_FILE\n"
               "busbw follows nccl-tests: algbw * 2(n-1)/n for allreduce, (n-1)/n for allgather, "
               "reduce_scatter, gather, scatter and alltoall (size = the whole gathered/scattered "
               "buffer, alltoall: each rank's), 1 for broadcast and reduce.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a("-n", "--nproc", type=_positive, default=None, metavar="N",
      help="start N local ranks (default 2); ignored when already a rank of a job started by "
           "ringreduce-run, torchrun, srun or mpirun")
    a("-b", "--minbytes", type=_size_arg, default=parse_size("8"), metavar="SIZE",
      help="smallest message size (default 8; suffixes K M G)")
    a("-e", "--maxbytes", type=_size_arg, default=parse_size("64M"), metavar="SIZE",
      help="largest message size (default 64M)")
    a("-f", "--stepfactor", type=float, default=2.0, metavar="F",
      help="multiply the size by F each step (default 2)")
    a("--stepbytes", type=_size_arg, default=0, metavar="SIZE",
      help="add SIZE each step instead of multiplying")
    a("-o", "--collective", dest="ops", type=_ops, default=["allreduce"], metavar="OP",
      help=f"collective(s), comma-separated: {', '.join(OPS)}, all (default allreduce)")
    a("-d", "--dtype", dest="dtypes", type=_dtypes, default=["float32"], metavar="TYPE",
      help=f"element type(s), comma-separated: {', '.join(DTYPES)} (those this torch has), "
           "all (default float32)")
    a("--op", "--redop", dest="redops", type=_redops, default=["sum"], metavar="REDOP",
      help=f"reduction(s) of allreduce, reduce_scatter and reduce, comma-separated: "
           f"{', '.join(REDOPS)}, all (default sum); the other collectives run once per type")
    a("-r", "--root", type=_nonneg, default=0,
      help="root of broadcast, reduce, gather and scatter (default 0)")
    a("--algo", choices=("auto", "ring", "tree", "shm", "hier"), default="auto",
      help="allreduce algorithm (default auto: shared memory within a host when enabled, "
           "else the cost model picks ring, tree (recursive doubling) or hier (shared memory "
           "inside hosts, rings between them) per size)")
    a("--transport", choices=("auto", "tcp", "shm"), default=None,
      help="set RINGREDUCE_TRANSPORT for the ranks (default: inherited, auto); the header "
           "shows the transport actually used")
    a("-w", "--warmup", type=_nonneg, default=5,
      help="warm-up iterations per size (default 5); each collective's first size also gets "
           "up to 50 untimed rounds (at most 64 MiB moved) for every library, so that the "
           "first timed size does not pay for cold caches and connection set-up")
    a("-i", "--iters", type=_iters, default=20,
      help="timed iterations per size (default 20; nccl-tests' -n)")
    a("-c", "--check", type=_checks, nargs="?", const=1, default=1, metavar="N",
      help="after the timed iterations, run N more whose results are verified (default 1, "
           "as nccl-tests' -c; 0: none); wrong elements go to the #wrong column")
    a("--compare", type=_anchors, default=[], metavar="LIBS",
      help="also measure gloo (torch.distributed), mpi (mpi4py + Open MPI) and/or nccl "
           "(torch.distributed's NCCL backend; needs --device cuda), e.g. gloo,mpi")
    a("--device", choices=("cpu", "cuda"), default="cpu",
      help="where the buffers live (default cpu); cuda puts rank r on cuda:(LOCAL_RANK %% "
           "devices) and ringreduce takes its CUDA path (backend auto)")
    a("--mpirun-args", default="", metavar="ARGS",
      help="extra mpirun arguments for the mpi anchor, e.g. '--mca btl tcp,self'")
    a("--json", metavar="FILE", help="write all results (with per-iteration times) as JSON")
    a("--csv", metavar="FILE", help="write one row per library and size as CSV")
    a("--plot", metavar="FILE.png", help="draw busbw vs size for every library (matplotlib)")
    a("--timeout", type=float, default=300.0, metavar="SECONDS",
      help="per-collective timeout for ringreduce and gloo (default 300)")
    a("--progress", choices=("auto", "always", "never"), default="auto",
      help="progress bar on stderr of rank 0 (auto: when stderr is a terminal)")
    a("--tune", action="store_true",
      help="fit the cost model's alpha (us/message) and beta (ns/byte) and print the ring/tree "
           "crossover instead of sweeping")
    a("--tune-out", metavar="FILE.json",
      help="with --tune: write the fit, for RINGREDUCE_TUNING_FILE")
    a("--model", action="store_true",
      help="print the cost model's predicted all-reduce time and pick for a cluster "
           "(--hosts x --ranks-per-host, --link-gbit, --alpha-us) and exit; starts no rank")
    a("--hosts", dest="model_hosts", type=_int_list, default=[1, 8, 64, 512], metavar="H,...",
      help="with --model: host counts (default 1,8,64,512)")
    a("--ranks-per-host", type=_positive, default=8, metavar="L",
      help="with --model: ranks per host (default 8)")
    a("--link-gbit", type=_finite(0.0, strict=True), default=100.0, metavar="G",
      help="with --model: each host's link, Gbit/s (default 100)")
    model = _C.COST_MODEL  # the core's defaults (csrc/core/params.h)
    a("--alpha-us", type=_finite(0.0, strict=False), default=model["alpha_us"], metavar="US",
      help=f"with --model: per-message latency between hosts (default {model['alpha_us']:g}, "
           f"this machine's TCP)")
    a("--shm-alpha-us", type=float, default=model["shm_alpha_us"], metavar="US",
      help=argparse.SUPPRESS)
    a("--shm-beta-ns-per-byte", type=float, default=model["shm_beta_ns_per_byte"],
      metavar="NS", help=argparse.SUPPRESS)
    a("--command", help=argparse.SUPPRESS)  # set by the launcher: the command as typed
    a("--mpi-results", help=argparse.SUPPRESS)  # set by the launcher: the mpirun job's output
    # Set by the launcher too: -e was checked before the ranks started (each rank's own
    # check saw less memory -- its siblings' imports -- and could refuse what was accepted).
    a("--memory-checked", action="store_true", help=argparse.SUPPRESS)
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the command line (errors exit with code 2, like argparse)."""
    p = build_parser()
    habit = _nccl_tests_habit(list(argv if argv is not None else sys.argv[1:]))
    if habit:
        p.error(habit)
    args = p.parse_args(argv)
    # One value each (None with several: each combination's own is set by the sweep).
    args.dtype = args.dtypes[0] if len(args.dtypes) == 1 else None
    args.redop = args.redops[0] if len(args.redops) == 1 else None
    try:
        args.sizes = size_sweep(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
    except ValueError as e:
        p.error(str(e))
    if args.tune_out and not args.tune:
        p.error("--tune-out needs --tune")
    if args.tune and (args.dtypes != ["float32"] or args.redops != ["sum"]):
        got = ", ".join(f"{opt} {','.join(v) if len(v) < 4 else f'{len(v)} values'}"
                        for opt, v, want in (("-d", args.dtypes, "float32"),
                                             ("--op", args.redops, "sum")) if v != [want])
        p.error(f"--tune fits the cost model to float32 sum all-reduces (its alpha and beta "
                f"are per message and per byte, whatever the type): drop {got}")
    total = available_bytes()
    # Each rank holds an input and an output (with --check also the expected result; an
    # in-place collective's output is its input, whose copy is kept instead), every rank on
    # this host at once -- in host memory unless --device cuda. Against the memory free now
    # (MemAvailable, or a container's limit), not MemTotal: a run that fits only on paper
    # is killed for memory part way.
    copies, local = 3 if args.check else 2, _local_ranks(args)
    if total and not (args.model or args.memory_checked) and args.device != "cuda" and \
            args.maxbytes * copies * local > total:
        p.error(f"-e {format_size(args.maxbytes)}: {local} rank(s) on this host holding "
                f"{copies} buffers of that size each{' (-c)' if args.check else ''} do not "
                f"fit the {format_size(total)} of memory available now; lower -e"
                f"{' or -n' if local > 1 else ''}{' or give -c 0' if args.check else ''}")
    # Modes that write other files: an output they ignore is said, not silently skipped.
    for mode, writes, ignored in (("model", "--json", ("csv", "plot")),
                                  ("tune", "--tune-out", ("json", "csv", "plot"))):
        given = [f"--{o}" for o in ignored if getattr(args, mode) and getattr(args, o)]
        if given:
            p.error(f"--{mode} writes {writes} only; drop {' and '.join(given)}")
    from .._env.tunables import check_seconds

    try:
        check_seconds("--timeout", args.timeout)
    except ValueError as e:
        p.error(str(e))
    for opt in ("json", "csv", "plot", "tune_out"):  # found before the sweep, not after it
        problem = getattr(args, opt) and output_problem(getattr(args, opt),
                                                        f"--{opt.replace('_', '-')}")
        if problem:
            p.error(problem)
    if args.plot and not args.model and all(op == "barrier" for op in args.ops):
        p.error(f"--plot {args.plot}: barrier has no message size to plot against; drop "
                f"--plot or add a sized collective to -o")
    if args.plot:
        problem = plot_problem(args.plot)
        if problem:
            p.error(problem)
    if "nccl" in args.compare and args.device != "cuda":
        p.error("--compare nccl needs --device cuda (NCCL moves CUDA buffers only)")
    return args


def _local_ranks(args: argparse.Namespace) -> int:
    """Ranks of the job on this host: -n, or the launcher's count when this is a rank of a
    job already (ringreduce-run, torchrun, srun, mpirun), else the default 2."""
    from .._env import detect_launch

    try:
        info = detect_launch()
    except ValueError:
        info = None
    if info is not None and info.source != "default":
        return max(1, info.local_world_size)
    return args.nproc or 2


def output_problem(path: str, what: str = "--json") -> str | None:
    """Why the file `path` (given as option `what`) cannot be written, else None."""
    folder = os.path.dirname(os.path.abspath(path))
    if not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
        return (f"{what} {path}: the folder {folder} does not exist or is not writable; "
                f"create it or pick another path")
    if os.path.isdir(path):
        return f"{what} {path} is a folder; give a file name"
    return None


def plot_problem(path: str, what: str = "--plot") -> str | None:
    """Why --plot `path` cannot be drawn (no matplotlib, a format it cannot write), else
    None: found before the sweep, not after it."""
    try:
        from matplotlib.backend_bases import FigureCanvasBase
    except ImportError:
        return "--plot needs matplotlib: pip install matplotlib (or ringreduce[bench])"
    kinds = FigureCanvasBase.get_supported_filetypes()
    suffix = os.path.splitext(path)[1].lstrip(".").lower()
    if suffix not in kinds:
        return (f"{what} {path}: name the file with a suffix matplotlib can write "
                f"({', '.join('.' + k for k in sorted(kinds))}), e.g. bench.png")
    return None


def cuda_problem(args: argparse.Namespace) -> str | None:
    """Why --device cuda / --compare nccl cannot run here ("no CUDA device: ..."), or None.
    Checked before any rank is spawned."""
    if args.device != "cuda":
        return None
    try:
        import torch
    except ImportError:
        return "no CUDA device: torch is not installed"
    if not torch.cuda.is_available():
        # The bench moves torch CUDA tensors: torch's own CUDA is what it needs first.
        if torch.version.cuda is None:
            return (f"no CUDA device: this torch ({torch.__version__}) is a CPU-only build; "
                    "install a CUDA build of torch")
        from ringreduce import gpu

        ok, why = gpu.cuda_status()
        return "no CUDA device: " + (why if not ok else "torch.cuda.is_available() is False "
                                     "(no driver or no visible device?)")
    if "nccl" in args.compare:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_nccl_available():
            return "no NCCL: this torch build has no NCCL backend (--compare nccl)"
    return None


def strip_nproc(argv: Sequence[str]) -> list[str]:
    """argv without -n/--nproc (the launcher passes the rest on to the ranks)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("-n", "--nproc"):
            skip = True
        elif not (a.startswith("--nproc=") or (a.startswith("-n") and a[2:].isdigit())):
            out.append(a)
    return out
