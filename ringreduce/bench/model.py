"""`ringreduce-bench --model`: the cost model's all-reduce predictions for a cluster that
need not exist -- ring, recursive doubling, binomial tree (modelled only) and hierarchical,
at n = hosts x ranks-per-host ranks and message sizes 8 B .. 1 GiB -- and the algorithm it
would pick. No rank is started; the formulas are the core's (collectives/cost_model.cc,
through _C.predict_allreduce_cluster), so what is printed is what the core believes.

    ringreduce-bench --model                                  # 1..512 hosts x 8, 100 Gbit/s
    ringreduce-bench --model --hosts 64,512 --ranks-per-host 8 --link-gbit 100 --alpha-us 10
"""

from __future__ import annotations

from argparse import Namespace

from .. import _C
from .cli import format_size
from .outfile import write_json

ALGOS = ("ring", "recursive_doubling", "binomial_tree", "hier")
SIZES = [8 << (3 * i) for i in range(10)]  # 8 B, 64 B, ..., 1 GiB
# ClusterModel's localAlphaUs / localBetaNsPerByte (collectives/collectives.h).
_FLAT_LOCAL = (f"loopback TCP: alpha {_C.COST_MODEL['alpha_us']:g} us, "
               f"{_C.COST_MODEL['beta_ns_per_byte']:g} ns/B (bench/alpha_beta.json)")
SHORT = {"ring": "ring", "recursive_doubling": "rd", "binomial_tree": "btree", "hier": "hier"}


def _fmt_time(s: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if s >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s * 1e6:.2g} us"


def predict(hosts: int, local: int, size: int, alpha_us: float, beta: float,
            shm_alpha_us: float, shm_beta: float) -> dict[str, float]:
    out = {a: _C.predict_allreduce_cluster(a, hosts, local, size, alpha_us, beta, shm_alpha_us,
                                          shm_beta) for a in ALGOS}
    if hosts == 1 or local == 1:  # hierarchical needs several hosts with several ranks
        out.pop("hier")
    return out


def table(args: Namespace) -> dict:
    beta = 8.0 / args.link_gbit  # ns per byte through one host's link
    rows = []
    for hosts in args.model_hosts:
        for size in SIZES:
            t = predict(hosts, args.ranks_per_host, size, args.alpha_us, beta,
                        args.shm_alpha_us, args.shm_beta_ns_per_byte)
            pick = _C.pick_allreduce_cluster(hosts, args.ranks_per_host, size, args.alpha_us,
                                             beta, args.shm_alpha_us, args.shm_beta_ns_per_byte)
            rows.append({"hosts": hosts, "n": hosts * args.ranks_per_host, "bytes": size,
                         "predicted_s": t, "pick": pick})
    return {"tool": "ringreduce-bench --model", "ranks_per_host": args.ranks_per_host,
            "link_gbit": args.link_gbit, "alpha_us": args.alpha_us, "beta_ns_per_byte": beta,
            "shm_alpha_us": args.shm_alpha_us, "shm_beta_ns_per_byte": args.shm_beta_ns_per_byte,
            "flat_hops_inside_a_host": _FLAT_LOCAL, "rows": rows}


def run(args: Namespace) -> int:
    res = table(args)
    print(f"# cost model: hosts x {args.ranks_per_host} ranks, {args.link_gbit:g} Gbit/s and "
          f"alpha {args.alpha_us:g} us between hosts, shared memory inside "
          f"(alpha {args.shm_alpha_us:g} us, {args.shm_beta_ns_per_byte:g} ns/B)")
    print(f"# ring and rd hops inside a host (several hosts): {_FLAT_LOCAL}")
    print("# predicted all-reduce time of the pick (ring, rd = recursive doubling, hier); "
          "btree = binomial tree, modelled only")
    ns = [h * args.ranks_per_host for h in args.model_hosts]
    print(f"{'size':>8}" + "".join(f"{f'n={n}':>18}" for n in ns))
    for size in SIZES:
        cells = []
        for r in res["rows"]:
            if r["bytes"] == size:
                cells.append(f"{_fmt_time(r['predicted_s'][r['pick']])} {SHORT[r['pick']]}")
        print(f"{format_size(size):>8}" + "".join(f"{c:>18}" for c in cells))
    if args.json:
        write_json(args.json, res, indent=1)
        print(f"# all algorithms' predictions written to {args.json}")
    return 0
