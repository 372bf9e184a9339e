"""Speed and peak memory of every registered attention mechanism in every context it supports.

    python -m benchmarks.attention --json                     # one JSON object per line
    python -m benchmarks.attention --markdown benchmarks/README.md
    python -m benchmarks.attention --quick --mechanisms softmax,coda --json   # smoke test

Options: --lengths, --mechanisms, --contexts, --threads, --warmup, --repeats, --wait-quiet,
--timeout, --interleave ROUNDS, --quick (tiny sizes, one repeat, in-process), --markdown
PATH.  Each JSON row has mechanism, context, B, H, L, d (and T), baseline, fwd_bwd_ms, fwd_ms,
peak_mb, alloc_peak_mb, ratio_time_vs_softmax, ratio_mem_vs_softmax, ratio_alloc_vs_softmax
(the ratios are against ``baseline``; interleaved also ratio_low, ratio_high, rounds) and
others_cpu; a case that failed has ``error`` instead of the numbers.

Cases (no padding, default options of each mechanism and the VARIANTS beside them, e.g.
``density:scheme=aqt`` in the decoder contexts; float32):

- ``multihead``: the per-head core (context 1) on q, k, v (B, H, L, d), self-attention,
  B=8, H=8, d=64, L in --lengths (128, 256, 512, 1024); baseline softmax (SDPA).
- ``alignment``: pairwise alignment (context 2) of a (B, L, D) and b (B, L, D), both pooled
  directions, DecompAtt size B=32, L=50, D=200; baseline softmax.
- ``decoder``: decoder attention (context 3), all T steps at once (teacher forcing), B=32,
  N=L=50 source positions, T=50, D=256; baseline ``additive`` (Bahdanau) when registered.
- ``decoder_step``: the same, one step at a time after ``precompute`` (what beam search and
  input-feeding decoders pay); times are per step, i.e. (precompute + T steps) / T.

Every number is forward + backward (``fwd_ms``: forward alone under no_grad) of the
mechanism's core including its own parameters, for a fixed random cotangent.

Limits on a CPU, by counting matrix products (a "unit" is one L x L x d product per head;
SDPA's flash kernel costs 7: q k^T and P v forward, and backward q k^T again, dP = dO v^T,
dV, dQ, dK).  CoDA: its L1 term has no matrix-product form, but d subtractions, absolute
values and adds per (i, j) run in SIMD vectors beside q.k's multiply-adds in the same pass
over the keys, so it costs about one more unit where it is computed (forward, the
recomputing backward and the gradient pass), not a "2-3x floor" of three passes that no
matrix product can do (measured: 1.22x SDPA's time at L=512 in results/attention_kernels.md's
run, 1.69x on the machine of results/attention_interleaved.md).  That holds on the AMD EPYC
(Zen 4), whose adds run on pipes of their own beside its multiply-adds; on an Intel Xeon with
two 512-bit ports for both, each L1 operation costs what a multiply-add does: CoDA's 7
product units and 11 L1 units (forward, recomputed, gradients) put its floor at 1.9x SDPA's
time there, and CoDA measured 1.38x its floor, 2.64x SDPA (`python -m benchmarks.floor`,
results/coda_floor.md).
The differentiable window (Eq. 7-11) needs, per head, the scores q k^T, the two boundary
scorings (q W_l) k^T and (q W_r) k^T and the output M v (4 units forward), AW also its
local scores (5 units); a backward that recomputes the score matrices instead of storing
them (3-4 units, what keeps memory within a few L x L tiles) and two units per score matrix
plus two for M v (8-10 units): 15 units for MW and 19 for AW, and AW's projections of the
input for its local scores add 6 more at d_model = H d = 512.  Profiled at L=512
(results/attention_interleaved.md): AW's products take 3.14x SDPA's whole step, MW's 1.93x,
at about 143 GFLOP/s, near what two cores of this CPU can do; storing the four score matrices
instead of recomputing them (64 MiB each at B H = 64, L=512: about 8x SDPA's tensor memory)
would cut AW's products only to about 2.64x.  So the 3x time goal is out of AW's reach on
this CPU with or without the memory goal; MW meets it at L=512 (2.52x, interleaved).  The
element-wise work (two boundary softmaxes, their cumulative sums, Eq. 9-11 and their
derivatives) was as much time again with torch.compile'd expressions; in the C++ row kernels
(attention/_window_rows.cpp) it is about 0.4x SDPA's time (10% of AW's step, 15% of MW's).

Method.  Each case runs in a fresh Python subprocess (``--isolate``, the default; ``--quick``
measures in-process, where a case's malloc settings carry over to the next) with
``torch.set_num_threads`` fixed.  After ``--warmup`` runs (which also trigger any
torch.compile), the median of ``--repeats`` timed runs is reported.  Then two memory
measurements of one more forward + backward each.  ``peak_mb``: torch has no CPU allocator
statistics, so the harness makes glibc return every block above 64 KiB to the kernel on free
(``mallopt(M_MMAP_THRESHOLD)``, then ``malloc_trim``), resets the kernel's resident-set
high-water mark (``/proc/self/clear_refs`` = 5), reads the resident set size just before the
step and reports ``VmHWM - VmRSS_before``: every page the step touched beyond the live
inputs, parameters and modules (outputs, gradients, saved activations, temporaries, kernel
workspaces, thread stacks).  ``alloc_peak_mb``: the peak of the bytes held by torch tensors
during the step beyond those held before it, from ``torch.profiler``'s memory timeline (what
``max_memory_allocated`` would say on a GPU).  Ratios divide by the baseline of the same
context and sizes measured in the same run.  The machine's load average is printed with the
results, and each row's ``others_cpu`` is the fraction of the machine's CPU time that other
processes used while it was measured; before each case the harness waits (``--wait-quiet``,
up to 60 s) for a second in which they leave ``--threads`` cores idle: timings of a shared
machine are only as good as its quiet.

``--interleave ROUNDS``: the cases of a group (one context and size: the baseline and the
mechanisms) run in one process and take turns, each case's forward + backward once per
round in a new random order, ROUNDS rounds after ``--warmup``; ``fwd_bwd_ms`` is the median,
the time ratio is the summed times' ratio with a 95% interval from 2,000 bootstrap resamples
of the paired rounds (``ratio_low``, ``ratio_high``).  Between separate runs this machine's
SDPA time moved 108-134 ms at L=512 even when quiet; a slow phase now falls on every case
of the round.  Only the tensor memory (``alloc_peak_mb``) is measured in this mode.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from benchmarks import peak_alloc_mb
from fileio import write_atomic

CONTEXT_ORDER = ("multihead", "alignment", "decoder", "decoder_step")
#: option variants measured beside a mechanism's defaults, per context: the density matrix's
#: AQT scheme beside MQT in the RNN decoder (AQT has no once-per-source shortcut), the
#: window's MW beside its default AW in multi-head attention
VARIANTS = {"multihead": {"window": ["window:variant=mw"]},  # AW is the default
            "decoder": {"density": ["density:scheme=aqt"]},
            "decoder_step": {"density": ["density:scheme=aqt"]}}


def mechanism(spec: str):
    """A mechanism from a benchmark name: ``name`` or ``name:option=value,...``."""
    from attention import build

    name, _, options = spec.partition(":")
    pairs = (item.split("=", 1) for item in options.split(",") if item)
    return build(name, **{key: value for key, value in pairs})
FULL = dict(lengths=(128, 256, 512, 1024), multihead=dict(B=8, H=8, d=64),
            alignment=dict(B=32, H=1, L=50, d=200), decoder=dict(B=32, H=1, L=50, d=256, T=50))
QUICK = dict(lengths=(8, 16), multihead=dict(B=2, H=2, d=8),
             alignment=dict(B=2, H=1, L=6, d=8), decoder=dict(B=2, H=1, L=6, d=8, T=4))


# -- one case -------------------------------------------------------------------------------
def _case_runner(case: dict) -> tuple[Callable[[], None], Callable[[], None], int]:
    """(forward + backward, forward under no_grad, number of steps the time is divided by)."""

    gen = torch.Generator().manual_seed(0)

    def randn(*shape, grad=True):
        return torch.randn(*shape, generator=gen).requires_grad_(grad)

    mech = mechanism(case["mechanism"])
    b, h, length, d = case["B"], case["H"], case["L"], case["d"]
    context = case["context"]
    if context == "multihead":
        core = mech.multihead(d_model=h * d, n_heads=h, dropout=0.0, self_attention=True)
        q, k, v = (randn(b, h, length, d) for _ in range(3))
        x = randn(b, length, h * d)  # un-projected input, for mechanisms with projections

        def forward():
            return [core(q, k, v, key_mask=None, causal=False, need_weights=False,
                         query_input=x, key_input=x)[0]]
        inputs = [q, k, v, x]
        steps = 1
    elif context == "alignment":
        core = mech.alignment(dim=d)
        a, bb = randn(b, length, d), randn(b, length, d)

        def forward():
            out = core(a, bb, None, None)
            return [out.a_aligned, out.b_aligned]
        inputs = [a, bb]
        steps = 1
    elif context in ("decoder", "decoder_step"):
        core = mech.decoder(query_dim=d, memory_dim=d)
        t = case["T"]
        mem, s = randn(b, length, d), randn(b, t, d)
        if context == "decoder":
            def forward():
                return [core(s, core.precompute(mem, None))[0]]
            steps = 1
        else:
            def forward():
                memory = core.precompute(mem, None)
                return [torch.stack([core.step(s[:, i], memory)[0] for i in range(t)], 1)]
            steps = t
        inputs = [mem, s]
    else:
        raise ValueError(f"unknown benchmark context {context!r}; expected one of "
                         f"{CONTEXT_ORDER}")
    params = list(core.parameters())
    with torch.no_grad():
        cotangents = [torch.randn(o.shape, generator=gen) for o in forward()]

    def fwd_bwd():
        for p in inputs + params:
            p.grad = None
        torch.autograd.backward(forward(), cotangents)

    def fwd():
        with torch.no_grad():
            forward()
    return fwd_bwd, fwd, steps


def _proc_status() -> dict[str, int] | None:
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    return {k: int(v) for k, v in re.findall(r"(Vm\w+):\s+(\d+) kB", text)}


def _peak_rss_mb(fn: Callable[[], None]) -> float | None:
    """Resident memory the call adds at its peak (MiB), see the module docstring; None where
    /proc/self/clear_refs is not available (not Linux)."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD: blocks > 64 KiB go back to the OS on free
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to VmRSS
    except OSError:
        return None
    before = _proc_status()["VmRSS"]
    fn()
    return (_proc_status()["VmHWM"] - before) / 1024


def _median_ms(fn: Callable[[], None], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def measure(case: dict, warmup: int, repeats: int, threads: int) -> dict:
    """Time and peak memory of one case, in this process (memory last: it changes malloc's
    settings)."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    fwd_bwd, fwd, steps = _case_runner(case)
    for _ in range(warmup):
        fwd_bwd()
        fwd()
    row = {**case, "fwd_bwd_ms": _median_ms(fwd_bwd, repeats) / steps,
           "fwd_ms": _median_ms(fwd, repeats) / steps}
    row["peak_mb"] = _peak_rss_mb(fwd_bwd)
    row["alloc_peak_mb"] = peak_alloc_mb(fwd_bwd)
    return row


def profile(case: dict, warmup: int, repeats: int, threads: int, top: int = 15) -> str:
    """Where the forward + backward of one case spends its time: torch.profiler's operators
    (and the C++ kernels' ``record_function`` ranges) by self CPU time over ``repeats``
    runs after ``warmup``, in this process."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    fwd_bwd, _, _ = _case_runner(case)
    for _ in range(warmup):
        fwd_bwd()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(repeats):
            fwd_bwd()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def measure_isolated(case: dict, warmup: int, repeats: int, threads: int,
                     timeout: float) -> dict:
    """``measure`` in a fresh subprocess, so no case inherits another's memory or caches."""
    cmd = [sys.executable, "-m", "benchmarks.attention", "--case", json.dumps(case),
           "--warmup", str(warmup), "--repeats", str(repeats), "--threads", str(threads)]
    root = Path(__file__).resolve().parents[1]
    try:
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**case, "error": f"timed out after {timeout:.0f} s", "timed_out": True}
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return {**case, "error": lines[-1] if lines else f"exit code {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def interleaved(group: list[dict], warmup: int, rounds: int, threads: int) -> list[dict]:
    """The cases of one group (its baseline first) in this process, taking turns
    (:func:`benchmarks.take_turns`): ``rounds`` times each case's forward + backward once, in
    a new random order each round; each ratio to the baseline with a 95% interval from the
    paired rounds (:func:`benchmarks.paired_ratio`).  Then each case's ``alloc_peak_mb``
    (``peak_mb`` needs a fresh process: None here)."""
    from benchmarks import paired_ratio, take_turns

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    runners = [_case_runner(case)[0] for case in group]
    for _ in range(warmup):
        for fn in runners:
            fn()

    def timed(i: int, _round) -> float:
        start = time.perf_counter()
        runners[i]()
        return time.perf_counter() - start

    times = take_turns(range(len(group)), range(rounds), timed)  # by position in the group
    allocs = [peak_alloc_mb(fn) for fn in runners]
    rows = []
    for i, case in enumerate(group):
        ratio, low, high = paired_ratio(times[0], times[i])
        rows.append({**case, "fwd_bwd_ms": 1000 * statistics.median(times[i]), "fwd_ms": None,
                     "peak_mb": None, "alloc_peak_mb": allocs[i], "rounds": rounds,
                     "ratio_time_vs_softmax": ratio, "ratio_low": low, "ratio_high": high,
                     "ratio_mem_vs_softmax": None,
                     "ratio_alloc_vs_softmax": _ratio(allocs[i], allocs[0])})
    return rows


# -- the grid -------------------------------------------------------------------------------
def cases(mechanisms: list[str], lengths: tuple[int, ...], sizes: dict,
          contexts: tuple[str, ...] = CONTEXT_ORDER) -> Iterator[dict]:
    """Every (mechanism, context, size) to measure, each size's baseline first."""
    from attention import REGISTRY

    def plan(context: str, baseline: str, size: dict) -> Iterator[dict]:
        if context not in contexts:
            return
        names = [baseline] + [m for m in mechanisms if m != baseline]
        ctx = "decoder" if context == "decoder_step" else context
        variants = VARIANTS.get(context, {})
        names = [v for name in names for v in [name, *variants.get(name, [])]]
        for name in names:
            if mechanism(name).supports(ctx):
                yield {"mechanism": name, "context": context, "baseline": baseline, **size}

    for length in lengths:
        yield from plan("multihead", "softmax", {**sizes["multihead"], "L": length})
    yield from plan("alignment", "softmax", sizes["alignment"])
    decoder_baseline = "additive" if "additive" in REGISTRY else "softmax"
    for context in ("decoder", "decoder_step"):
        yield from plan(context, decoder_baseline, sizes["decoder"])


def run(mechanisms: list[str], lengths: tuple[int, ...], sizes: dict, *, isolate: bool,
        warmup: int, repeats: int, threads: int, contexts: tuple[str, ...] = CONTEXT_ORDER,
        wait_quiet: float = 0.0, timeout: float = 1800.0) -> Iterator[dict]:
    """Measure every case; yields rows with the ratios against the baseline of their group."""
    baselines: dict[tuple, dict] = {}
    for case in cases(mechanisms, lengths, sizes, contexts):
        if wait_quiet > 0:
            _wait_quiet(wait_quiet, threads)
        with _OtherLoad(isolate) as load:
            row = (measure_isolated(case, warmup, repeats, threads, timeout) if isolate
                   else _measure_or_error(case, warmup, repeats, threads))
        row["others_cpu"] = load.fraction
        group = (case["context"], case["B"], case["H"], case["L"], case["d"])
        if case["mechanism"] == case["baseline"]:
            baselines[group] = row
        base = baselines.get(group, {})
        row["ratio_time_vs_softmax"] = _ratio(row.get("fwd_bwd_ms"), base.get("fwd_bwd_ms"))
        row["ratio_mem_vs_softmax"] = _ratio(row.get("peak_mb"), base.get("peak_mb"))
        row["ratio_alloc_vs_softmax"] = _ratio(row.get("alloc_peak_mb"),
                                               base.get("alloc_peak_mb"))
        yield row


def run_interleaved(mechanisms: list[str], lengths: tuple[int, ...], sizes: dict, *,
                    warmup: int, rounds: int, threads: int,
                    contexts: tuple[str, ...] = CONTEXT_ORDER,
                    wait_quiet: float = 0.0) -> Iterator[dict]:
    """:func:`interleaved` over each group of cases (a context and size: its baseline and
    mechanisms), in this process."""
    groups: dict[tuple, list[dict]] = {}
    for case in cases(mechanisms, lengths, sizes, contexts):
        key = (case["context"], case["B"], case["H"], case["L"], case["d"])
        groups.setdefault(key, []).append(case)
    for group in groups.values():
        if wait_quiet > 0:
            _wait_quiet(wait_quiet, threads)
        with _OtherLoad(False) as load:
            rows = interleaved(group, warmup, rounds, threads)
        for row in rows:
            row["others_cpu"] = load.fraction
            yield row


def _cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat (Linux)."""
    try:
        ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)  # minus idle and iowait


def _wait_quiet(max_wait: float, threads: int) -> None:
    """Wait (at most ``max_wait`` s) for a second in which other processes leave ``threads``
    cores idle (within a tenth of a core): on a shared machine, timings are only as good as
    its quiet."""
    cores = os.cpu_count() or 1
    allowed = max(0.0, cores - threads) + 0.1  # cores other processes may keep busy
    deadline = time.monotonic() + max_wait
    while time.monotonic() < deadline:
        before = _cpu_jiffies()
        time.sleep(1.0)
        after = _cpu_jiffies()
        if before is None or after is None:
            return
        if cores * (after[0] - before[0]) / max(1, after[1] - before[1]) < allowed:
            return


class _OtherLoad:
    """The fraction of the machine's CPU time used by other processes during a case:
    all busy ticks minus this harness's own CPU time (its finished subprocesses when
    ``children``)."""

    def __init__(self, children: bool):
        self.who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
        self.fraction: float | None = None

    def _ours(self) -> float:
        usage = resource.getrusage(self.who)
        return usage.ru_utime + usage.ru_stime

    def __enter__(self):
        self.start, self.ours = _cpu_jiffies(), self._ours()
        return self

    def __exit__(self, *exc):
        end = _cpu_jiffies()
        if self.start is not None and end is not None and end[1] > self.start[1]:
            ours = (self._ours() - self.ours) * os.sysconf("SC_CLK_TCK")
            busy = end[0] - self.start[0] - ours
            self.fraction = round(max(0.0, busy / (end[1] - self.start[1])), 3)
        return False


def _measure_or_error(case, warmup, repeats, threads) -> dict:
    try:
        return measure(case, warmup, repeats, threads)
    except Exception as err:  # noqa: BLE001 - a failing mechanism is reported, not fatal
        return {**case, "error": f"{type(err).__name__}: {err}"}


def _ratio(x: float | None, base: float | None) -> float | None:
    if x is None or base is None:
        return None
    if x == base:  # the baseline itself
        return 1.0
    return x / base if base > 0 else None


# -- output ---------------------------------------------------------------------------------
def machine() -> dict:
    from lit_models.base import cpu_host  # the CPU model as every run records it

    return {"cpu": cpu_host()["machine/cpu_model"], "cores": os.cpu_count(),
            "torch": torch.__version__, "python": platform.python_version()}


def markdown(rows: list[dict], command: str, threads: int, load: tuple[str, str]) -> str:
    info = machine()
    method = __doc__[__doc__.index("Cases"):].strip()
    lines = [
        "# Attention benchmark", "",
        f"Generated by `{command}` on {datetime.date.today().isoformat()}.", "",
        f"Machine: {info['cpu']}, {info['cores']} cores, torch {info['torch']}, python "
        f"{info['python']}, `torch.set_num_threads({threads})`, float32, CPU.  Load average "
        f"(1 min) {load[0]} before the run, {load[1]} after.", "",
        "## Method", "", method, "",
    ]
    for context in CONTEXT_ORDER:
        group = [r for r in rows if r["context"] == context]
        if not group:
            continue
        r0 = group[0]
        sizes = (f"B={r0['B']}, H={r0['H']}, d={r0['d']}" if context == "multihead" else
                 f"B={r0['B']}, L={r0['L']}, D={r0['d']}" + (f", T={r0['T']}" if "T" in r0
                                                              else ""))
        unit = "ms/step" if context == "decoder_step" else "ms"
        lines += [f"## {context} ({sizes}; ratios against {r0['baseline']})", "",
                  f"| mechanism | L | fwd+bwd {unit} | fwd {unit} | peak MB | alloc MB | "
                  "time ratio | memory ratio | alloc ratio | others' CPU |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in group:
            if "error" in r:
                lines.append(f"| {r['mechanism']} | {r['L']} | failed: {r['error']} "
                             "| | | | | | | |")
                continue
            lines.append(" | ".join([
                f"| {r['mechanism']}", str(r["L"]), _fmt(r["fwd_bwd_ms"]), _fmt(r["fwd_ms"]),
                _fmt(r["peak_mb"]), _fmt(r.get("alloc_peak_mb")),
                _time_ratio(r), _fmt(r["ratio_mem_vs_softmax"], 2),
                _fmt(r.get("ratio_alloc_vs_softmax"), 2), _pct(r.get("others_cpu"))]) + " |")
        lines.append("")
    return "\n".join(lines)


def _time_ratio(row: dict) -> str:
    """The time ratio, with its 95% interval when the cases were interleaved."""
    text = _fmt(row["ratio_time_vs_softmax"], 2)
    if row.get("ratio_low") is not None:
        text += f" [{row['ratio_low']:.2f}, {row['ratio_high']:.2f}]"
    return text


def _load() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "n/a"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


def _fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _parser() -> argparse.ArgumentParser:
    """The command line (its help: the module docstring's first paragraph)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print one JSON object per line")
    parser.add_argument("--markdown", metavar="PATH", help="write a markdown report to PATH")
    parser.add_argument("--mechanisms", help="comma-separated names (default: all registered)")
    parser.add_argument("--lengths", help="comma-separated multihead lengths "
                                          "(default 128,256,512,1024; quick 8,16)")
    parser.add_argument("--contexts", default=",".join(CONTEXT_ORDER),
                        help=f"comma-separated subset of {','.join(CONTEXT_ORDER)}")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, one repeat, measured in-process (a smoke test)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--warmup", type=int, default=None, help="default 2 (quick 1)")
    parser.add_argument("--repeats", type=int, default=None, help="default 5 (quick 1)")
    parser.add_argument("--wait-quiet", type=float, default=None, metavar="SECONDS",
                        help="before each case wait up to SECONDS for other processes to leave "
                             "the CPUs idle (default 60; quick 0)")
    parser.add_argument("--timeout", type=float, default=900.0, metavar="SECONDS",
                        help="give up on an isolated case after SECONDS (reported, not fatal)")
    parser.add_argument("--isolate", action=argparse.BooleanOptionalAction, default=None,
                        help="one subprocess per case (default; --quick: in-process)")
    parser.add_argument("--profile", action="store_true",
                        help="print torch.profiler's top operators (self CPU time) of each "
                             "case's forward + backward instead of timing it (in-process)")
    parser.add_argument("--interleave", type=int, metavar="ROUNDS",
                        help="time each group's cases (a length's baseline and mechanisms) in "
                             "one process, taking turns ROUNDS times, and give each time ratio "
                             "a paired 95%% interval; tensor memory only (no resident set)")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: measure one JSON case
    return parser


def _selection(parser: argparse.ArgumentParser, args: argparse.Namespace, registry: dict):
    """(mechanism names, multihead lengths, sizes, contexts) of the flags; a mechanism not in
    ``registry``, an unknown context or a malformed length is the parser's error."""
    names = list(registry) if not args.mechanisms else args.mechanisms.split(",")
    unknown = [n for n in names if n not in registry]
    if unknown:
        parser.error(f"unknown mechanism(s) {', '.join(unknown)}; registered: "
                     f"{', '.join(registry)}")
    sizes = QUICK if args.quick else FULL
    lengths = sizes["lengths"]
    if args.lengths:
        try:
            lengths = tuple(int(x) for x in args.lengths.split(","))
        except ValueError:
            parser.error(f"--lengths expects comma-separated integers, got {args.lengths!r}")
    contexts = tuple(args.contexts.split(","))
    if not set(contexts) <= set(CONTEXT_ORDER):
        parser.error(f"--contexts expects a subset of {','.join(CONTEXT_ORDER)}, got "
                     f"{args.contexts!r}")
    return names, lengths, sizes, contexts


def _measured(args: argparse.Namespace, names, lengths, sizes, contexts, warmup: int,
              repeats: int):
    """The rows of the cases, as they are measured: one process per case or in-process
    (:func:`run`), or interleaved (:func:`run_interleaved`)."""
    isolate = (not args.quick) if args.isolate is None else args.isolate
    wait_quiet = args.wait_quiet if args.wait_quiet is not None else (0.0 if args.quick
                                                                      else 60.0)
    if args.interleave is None:
        return run(names, lengths, sizes, isolate=isolate, warmup=warmup, repeats=repeats,
                   threads=args.threads, contexts=contexts, timeout=args.timeout,
                   wait_quiet=wait_quiet)
    return run_interleaved(names, lengths, sizes, warmup=warmup, rounds=args.interleave,
                           threads=args.threads, contexts=contexts, wait_quiet=wait_quiet)


def _text_row(row: dict) -> str:
    """A measured row as one line of plain text (neither --json nor --markdown)."""
    return (f"{row['mechanism']:>10} {row['context']:>12} L={row['L']:<5} "
            + (f"failed: {row['error']}" if "error" in row else
               f"{_fmt(row['fwd_bwd_ms'])} ms  {_fmt(row['peak_mb'])} MB  "
               f"x{_time_ratio(row)} time  "
               f"x{_fmt(row['ratio_mem_vs_softmax'], 2)} memory  "
               f"x{_fmt(row.get('ratio_alloc_vs_softmax'), 2)} tensor memory"))


def _failures(rows: list[dict]) -> int:
    """Report the failed cases on stderr; the exit status: 1 if any failed other than by
    timing out, else 0."""
    failed = [r for r in rows if "error" in r]
    for r in failed:
        print(f"benchmark failed: {r['mechanism']} {r['context']} L={r['L']}: {r['error']}",
              file=sys.stderr)
    return 1 if any(not r.get("timed_out") for r in failed) else 0


def main(argv: list[str] | None = None) -> int:
    from attention import REGISTRY

    parser = _parser()
    args = parser.parse_args(argv)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    repeats = args.repeats if args.repeats is not None else (1 if args.quick else 5)
    if args.case:
        print(json.dumps(measure(json.loads(args.case), warmup, repeats, args.threads)))
        return 0
    names, lengths, sizes, contexts = _selection(parser, args, REGISTRY)
    if args.profile:
        for case in cases(names, lengths, sizes, contexts):
            print(f"== {case['mechanism']} {case['context']} L={case['L']} "
                  f"({args.threads} threads, {repeats} runs)", flush=True)
            print(profile(case, warmup, repeats, args.threads), flush=True)
        return 0
    if args.interleave is not None and args.interleave < 1:
        parser.error(f"--interleave expects a number of rounds >= 1, got {args.interleave}")
    rows, load_before = [], _load()
    for row in _measured(args, names, lengths, sizes, contexts, warmup, repeats):
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
        elif not args.markdown:
            print(_text_row(row), flush=True)
    if args.markdown:
        command = "python -m benchmarks.attention " + " ".join(argv if argv is not None
                                                                else sys.argv[1:])
        write_atomic(args.markdown, markdown(rows, command, args.threads,
                                             (load_before, _load())))
    return _failures(rows)

if __name__ == "__main__":
    sys.exit(main())
