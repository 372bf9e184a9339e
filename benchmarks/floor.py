"""CoDA's multi-head attention against its own floor, and against SDPA, in one process.

    python -m benchmarks.floor --length 512 --rounds 20 --threads 1 --out results/coda_floor/x.jsonl
    python -m benchmarks.floor --quick          # tiny sizes (a smoke test, numbers meaningless)

The case is benchmarks/attention.py's ``multihead`` one (B=8, H=8, d=64, forward + backward,
float32, CoDA's paper defaults there: 1/sqrt(d), the ``scaled`` gate).  In every round, in a
new random order (:func:`benchmarks.take_turns`), one run each of:

- ``softmax`` and ``coda``: the whole forward + backward of each (benchmarks.attention's
  runners);
- CoDA's parts, on the tiles its autograd function walks over (:mod:`attention._coda_kernels`),
  each over all B H matrices once: ``l1_fwd`` (the C++ kernel's q.k and L1 distances D in
  one pass, the forward's), ``gate_fwd`` (Eq. 1-6, the element-wise block as CoDA runs it:
  the C++ kernel where it applies, as here, else the compiled block),
  ``mv_fwd`` (M v), ``l1_bwd`` (the backward's recomputed q.k and D, and dL/d(M v) v^T beside
  them), ``gate_bwd`` (the derivative block, C++ or compiled likewise), ``mv_bwd``
  (dL/dv = M^T dL/d(M v)),
  ``l1_grads`` (the C++ gradient kernel: dL/dq, dL/dk of the L1 term and of q.k); where CoDA
  runs Eq. 1-6 fused into the C++ forward kernel's tiles (float32, the paper's functions:
  :data:`attention.coda.FUSED_EQ`, as here), ``l1_eq_fwd`` (q.k, D and Eq. 1-6 in one pass)
  and ``l1_eq_bwd`` (q.k, D, dL/d(M v) v^T and Eq. 1-6's derivative in one pass) take the
  places of ``l1_fwd`` + ``gate_fwd`` and ``l1_bwd`` + ``gate_bwd``, timed as CoDA runs them
  (the floor below does not change: the same work, counted the same way);
- probes of this CPU's peaks (:mod:`benchmarks.peak`): ``matmul`` (a 1024^3 float32 product,
  MKL), ``l1_cache`` (the C++ L1 kernel, D alone, on one 256 x 256 x 64 matrix pair that stays
  in cache, repeated), ``exp_cache`` (torch.exp over 256K floats in cache).

The work of one CoDA forward + backward, per head, in units of L x L x d (a "unit": one
multiply-add or one vector-lane operation per (i, j, t)): the matrix products E = q k^T and M v
forward, and backward (the tiles are recomputed, as flash attention does, to keep memory
within 2x SDPA's) q k^T again, dL/dM = dL/d(M v) v^T, dL/dv = M^T dL/d(M v), dL/dq = dE k,
dL/dk = dE^T q: 7 units of multiply-adds, as SDPA's flash kernel; the L1 distances
D_ij = sum_t |q_it - k_jt|: a subtraction, an absolute value and an add per (i, j, t), in the
forward and again in the backward (3 + 3 units), and their gradients w_ij sign(q_it - k_jt)
into dq_i and dk_j: a subtraction, a comparison with zero and a signed select (sign(0) = 0),
and two accumulations (5 units); and per (i, j) the element-wise Eq. 1-6 and its derivative:
4 exponentials (tanh and sigmoid, forward and recomputed) and about 25 other operations.

Peaks, measured in the same rounds: the products' at ``matmul``'s FLOP/s; the L1 work's at
the vector peak, the larger of the matmul's lane rate (FLOP/s / 2: on this Xeon's
AVX-512 cores multiply-adds, adds, logic and comparisons all issue on the same two 512-bit
ports, so a lane-operation costs what a multiply-add does) and ``l1_cache``'s (3 operations per
element); the exponentials at ``exp_cache``'s rate.  CoDA's floor is

    7 U * 2 / matmul FLOP/s  +  11 U / vector peak  +  (4 / exp rate + 25 / vector peak) B H L^2

(U = B H L^2 d), computed per round from that round's probes, and its time is stated as a ratio
of the floor beside its ratio to SDPA (each with a paired 95% interval over the rounds), with
each part's achieved rate against its peak.  SDPA's own floor (its 7 units at the matmul peak)
is stated too.  Not a test: nothing is asserted on times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks import paired_ratio, provenance, take_turns
from benchmarks.peak import Probe, matmul_probe, rate
from fileio import write_atomic

#: lane-operations per (i, j, t) of the L1 term: forward, recomputed, gradients
L1_OPS = {"forward": 3, "recomputed": 3, "gradients": 5}
#: matrix-product units (multiply-adds per (i, j, t)) of CoDA's and SDPA's forward + backward
PRODUCT_UNITS = 7
#: per (i, j): exponentials and other lane-operations of Eq. 1-6 and its derivative
GATE_EXPS, GATE_OPS = 4, 25


def coda_parts(b: int, h: int, length: int, d: int) -> dict[str, Probe]:
    """CoDA's parts at the multihead case's size, each over all B H matrices once, with the
    tiles, options and kernels its autograd function uses; ``ops`` counts lane-operations
    (the products' multiply-adds and the L1 term's operations per (i, j, t), per part), or
    elements for the element-wise blocks."""
    from attention import _coda_l1_ext
    from attention._coda_kernels import L1Pair, tiles
    from attention.coda import _OPS, _Options

    gen = torch.Generator().manual_seed(0)
    n = b * h
    q, k, v, g_out = (torch.randn(n, length, d, generator=gen) for _ in range(4))
    opt = _Options(1 / d**0.5, -1 / d**0.5, "scaled", "tanh", "sigmoid")  # Eq. 10's defaults
    pair = L1Pair(k)
    walk = tiles(n, length, length, q)
    n0, n1, i0, i1 = walk[0]
    qb0 = q[n0:n1, i0:i1].contiguous()
    qk0, dist0 = pair.products(qb0, slice(n0, n1))  # one tile's inputs for the gate blocks
    d_md0 = torch.randn(qk0.shape, generator=gen)

    def gate_fwd():  # as Rows.forward runs it: C++ where it applies, else compiled
        out = _OPS.native_forward(qk0, dist0, None, None, None, None, 0.0, opt, False)
        return _OPS.forward(qk0, dist0, None, None, None, None, opt) if out is None else out

    def gate_bwd():
        out = _OPS.native_backward(qk0, dist0, None, None, None, None, 0.0, d_md0, None, opt)
        return (_OPS.backward(qk0, dist0, None, None, None, None, d_md0, None, None, None, opt)
                if out is None else out)

    md0, de0, dn0 = gate_bwd()
    # Eq. 1-6 fused into the C++ forward kernel's tiles, where CoDA runs it so (Rows._fused)
    scales = _OPS.fused_scales(opt, None, None, qb0, k[n0:n1])
    grad_k = torch.zeros_like(k)
    grad_v = torch.zeros_like(v)

    def each_tile(fn: Callable[[slice, int, int, torch.Tensor], object]) -> Callable[[], None]:
        def run():
            for a0, a1, r0, r1 in walk:
                fn(slice(a0, a1), r0, r1, q[a0:a1, r0:r1].contiguous())
        return run

    unit = n * length * length * d  # multiply-adds of one L x L x d product over B H heads
    pairs = n * length * length
    parts = {
        "l1_fwd": (each_tile(lambda ns, r0, r1, qb: pair.products(qb, ns)),
                   unit * (L1_OPS["forward"] + 1), "q.k and D (C++)"),
        "gate_fwd": (each_tile(lambda ns, r0, r1, qb: gate_fwd()), pairs, "Eq. 1-6"),
        "mv_fwd": (each_tile(lambda ns, r0, r1, qb: torch.bmm(md0, v[ns])), unit, "M v (bmm)"),
        "l1_bwd": (each_tile(lambda ns, r0, r1, qb: pair.products(qb, ns, g_out[ns, r0:r1],
                                                                   v[ns])),
                   unit * (L1_OPS["recomputed"] + 2), "q.k, D and dL/dM recomputed (C++)"),
        "gate_bwd": (each_tile(lambda ns, r0, r1, qb: gate_bwd()), pairs,
                     "Eq. 1-6 derivative"),
        "mv_bwd": (each_tile(lambda ns, r0, r1, qb: grad_v[ns].baddbmm_(
            md0.transpose(1, 2), g_out[ns, r0:r1])), unit, "dL/dv = M^T dL/d(M v) (baddbmm)"),
        "l1_grads": (each_tile(lambda ns, r0, r1, qb: pair.grads(dn0, qb, dist0, grad_k[ns], ns,
                                                                 de0)),
                     unit * (L1_OPS["gradients"] + 2), "dL/dq, dL/dk of D and q.k (C++)"),
    }
    if scales is not None:
        fused = {
            "l1_eq_fwd": (each_tile(lambda ns, r0, r1, qb: _coda_l1_ext.fused_forward(
                qb, k[ns], None, None, 0.0, *scales, need_m=False)),
                unit * (L1_OPS["forward"] + 1), "q.k, D and Eq. 1-6 in one pass (C++, fused)"),
            "l1_eq_bwd": (each_tile(lambda ns, r0, r1, qb: _coda_l1_ext.fused_backward(
                qb, k[ns], g_out[ns, r0:r1], v[ns], None, None, 0.0, None, *scales)),
                unit * (L1_OPS["recomputed"] + 2),
                "q.k, D, dL/dM recomputed and Eq. 1-6's derivative in one pass (C++, fused)")}
        parts = {"l1_eq_fwd": fused["l1_eq_fwd"], "mv_fwd": parts["mv_fwd"],
                 "l1_eq_bwd": fused["l1_eq_bwd"], "mv_bwd": parts["mv_bwd"],
                 "l1_grads": parts["l1_grads"]}
    return {name: Probe(fn, ops, what) for name, (fn, ops, what) in parts.items()}


def peak_probes(quick: bool) -> dict[str, Probe]:
    """This CPU's peaks: a float32 matmul, the C++ L1 kernel in cache, exp in cache."""
    from attention import _coda_l1_ext

    gen = torch.Generator().manual_seed(1)
    size, repeats = (32, 2) if quick else (256, 24)
    q, k = (torch.randn(1, size, 64, generator=gen) for _ in range(2))
    x = torch.randn(1 << (10 if quick else 18), generator=gen)
    y = torch.empty_like(x)
    exp_repeats = 2 if quick else 16

    def l1_cache():
        for _ in range(repeats):
            _coda_l1_ext.distance(q, k)

    def exp_cache():
        for _ in range(exp_repeats):
            torch.exp(x, out=y)

    probes = {"matmul": matmul_probe(torch.float32, 64 if quick else 1024)}
    if _coda_l1_ext.supports(q, k):
        probes["l1_cache"] = Probe(l1_cache, 3.0 * size * size * 64 * repeats,
                                   f"C++ L1 distance, {size} x {size} x 64 in cache, x{repeats}")
    probes["exp_cache"] = Probe(exp_cache, float(x.numel() * exp_repeats),
                                f"torch.exp of {x.numel()} floats in cache, x{exp_repeats}")
    return probes


def measure(length: int, rounds: int, warmup: int, threads: int, quick: bool = False) -> dict:
    """Every runner and probe taking turns ``rounds`` times; the rows (see the module
    docstring)."""
    from benchmarks.attention import FULL, QUICK, _case_runner

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    sizes = (QUICK if quick else FULL)["multihead"]
    b, h, d = sizes["B"], sizes["H"], sizes["d"]
    case = dict(context="multihead", B=b, H=h, L=length, d=d, baseline="softmax")
    runners: dict[str, Callable[[], float]] = {}
    for name in ("softmax", "coda"):
        runners[name] = Probe(_case_runner({**case, "mechanism": name})[0], 0.0, name).step
    parts = coda_parts(b, h, length, d)
    probes = peak_probes(quick)
    for name, probe in {**parts, **probes}.items():
        runners[name] = probe.step
    for _ in range(warmup):
        for fn in runners.values():
            fn()
    times = take_turns(list(runners), range(rounds), lambda name, _r: runners[name]())
    return summarise(times, parts, probes, b * h, length, d)


def summarise(times: dict[str, list[float]], parts: dict[str, Probe],
              probes: dict[str, Probe], n: int, length: int, d: int) -> dict:
    """The floor per round, the ratios with paired intervals and each part's rate."""
    unit = n * length * length * d
    pairs = n * length * length
    matmul = probes["matmul"]
    mm_rate = rate(matmul.ops, times["matmul"])  # FLOP/s
    lane_rates = {"matmul": mm_rate / 2}
    if "l1_cache" in probes:
        lane_rates["l1_cache"] = rate(probes["l1_cache"].ops, times["l1_cache"])
    vector_from = max(lane_rates, key=lane_rates.get)
    exp = probes["exp_cache"]
    l1_units = sum(L1_OPS.values())

    def floor_of(r: int) -> float:
        mm = matmul.ops / times["matmul"][r]
        vec = (mm / 2 if vector_from == "matmul"
               else probes[vector_from].ops / times[vector_from][r])
        ex = exp.ops / times["exp_cache"][r]
        return (PRODUCT_UNITS * unit * 2 / mm + l1_units * unit / vec
                + pairs * (GATE_EXPS / ex + GATE_OPS / vec))

    rounds = len(times["coda"])
    floors = [floor_of(r) for r in range(rounds)]
    sdpa_floors = [PRODUCT_UNITS * unit * 2 * times["matmul"][r] / matmul.ops
                   for r in range(rounds)]
    vec = lane_rates[vector_from]
    ex_rate = rate(exp.ops, times["exp_cache"])
    floor_parts = {"products": PRODUCT_UNITS * unit * 2 / mm_rate,
                   "l1": l1_units * unit / vec,
                   "element-wise": pairs * (GATE_EXPS / ex_rate + GATE_OPS / vec)}

    def ms(name: str) -> float:
        return 1000 * statistics.median(times[name])

    def ratio(base: list[float], name: str) -> dict:
        value, low, high = paired_ratio(base, times[name])
        return {"ratio": value, "low": low, "high": high}

    rows = {}
    for name, values in times.items():
        row = {"ms": ms(name), "vs_softmax": ratio(times["softmax"], name)}
        if name in parts:
            achieved = rate(parts[name].ops, values)
            peak = vec if name.startswith("l1") else mm_rate / 2 if name.startswith("mv") else None
            row.update(what=parts[name].what, ops=parts[name].ops, rate=achieved,
                       of_peak=None if peak is None else achieved / peak,
                       vs_coda=ratio(times["coda"], name))
        elif name in probes:
            row.update(what=probes[name].what, ops=probes[name].ops,
                       rate=rate(probes[name].ops, values))
        rows[name] = row
    part_sum = sum(sum(times[p]) for p in parts) / sum(times["coda"])
    return {
        "rows": rows,
        "matmul_gflops": mm_rate / 1e9,
        "vector_peak_glanes": vec / 1e9, "vector_peak_from": vector_from,
        "lane_rates_g": {k: v / 1e9 for k, v in lane_rates.items()},
        "exp_rate_g": ex_rate / 1e9,
        "floor_ms": 1000 * statistics.median(floors),
        "floor_parts_ms": {k: 1000 * v for k, v in floor_parts.items()},
        "coda_vs_floor": ratio(floors, "coda"),
        "softmax_vs_its_floor": ratio(sdpa_floors, "softmax"),
        "coda_vs_softmax": ratio(times["softmax"], "coda"),
        "floor_vs_softmax": dict(zip(("ratio", "low", "high"),
                                     paired_ratio(times["softmax"], floors), strict=True)),
        "parts_sum_vs_coda": part_sum,
        "units": {"products": PRODUCT_UNITS, "l1": dict(L1_OPS),
                  "gate_per_pair": {"exp": GATE_EXPS, "ops": GATE_OPS}},
    }


def setting(argv: list[str], args: argparse.Namespace) -> dict:
    """The command, machine (CPU model and flags that matter), threads, load, date, commit,
    the C++ L1 kernel's vector width and the rounds."""
    return {**provenance("benchmarks.floor", argv), "coda_l1_vector_bytes": _vector_bytes(),
            "rounds": args.rounds}


def _vector_bytes() -> int | None:
    """The vector width the C++ L1 kernel was built for on this CPU (bytes)."""
    from attention import _coda_l1_ext

    lib = _coda_l1_ext.library()
    return None if lib is None else int(lib.coda_l1_vector_bytes())


def report(result: dict) -> str:
    """The result as a few lines of text."""
    rows = result["rows"]
    lines = [f"matmul {result['matmul_gflops']:.1f} GFLOP/s; vector peak "
             f"{result['vector_peak_glanes']:.1f} G lane-ops/s (from {result['vector_peak_from']}"
             f"; {', '.join(f'{k} {v:.1f}' for k, v in result['lane_rates_g'].items())}); exp "
             f"{result['exp_rate_g']:.2f} G/s",
             f"floor {result['floor_ms']:.1f} ms ("
             + ", ".join(f"{k} {v:.1f}" for k, v in result["floor_parts_ms"].items()) + ")"]
    for key in ("coda_vs_floor", "coda_vs_softmax", "floor_vs_softmax", "softmax_vs_its_floor"):
        r = result[key]
        lines.append(f"{key}: {r['ratio']:.2f}x [{r['low']:.2f}, {r['high']:.2f}]")
    lines.append(f"parts sum / coda: {result['parts_sum_vs_coda']:.2f}")
    lines.append("| runner | ms (median) | vs SDPA | share of CoDA | rate (G/s) | of peak | what |")
    lines.append("|---|---:|---:|---:|---:|---:|---|")
    for name, r in rows.items():
        share = f"{r['vs_coda']['ratio']:.2f}" if "vs_coda" in r else ""
        rate_text = f"{r['rate'] / 1e9:.2f}" if "rate" in r else ""
        peak = f"{r['of_peak']:.0%}" if r.get("of_peak") is not None else ""
        lines.append(f"| {name} | {r['ms']:.1f} | {r['vs_softmax']['ratio']:.2f}x | {share} | "
                     f"{rate_text} | {peak} | {r.get('what', '')} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m benchmarks.floor",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=512)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    p.add_argument("--out", type=Path, default=None, help="write the result (one JSON line)")
    args = p.parse_args(argv)
    if min(args.rounds, args.threads, args.length) < 1 or args.warmup < 0:
        p.error("--rounds, --threads and --length must be at least 1, --warmup at least 0")
    length = 16 if args.quick else args.length
    result = measure(length, args.rounds, args.warmup, args.threads, args.quick)
    result["setting"] = setting(argv, args)
    result["L"] = length
    print(report(result), flush=True)
    if args.out:
        write_atomic(args.out, json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
