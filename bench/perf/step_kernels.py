#!/usr/bin/env python3
"""One denoising step, kernel by kernel, from Nsight Compute's CSV.

usage: step_kernels.py NCU_CSV [--step N] [--top K]

NCU_CSV is what `ncu --metrics gpu__time_duration.sum --csv --print-units
base` prints over bench-generate (bench/perf/step-kernels.sh runs it):
one row per kernel launch, its duration in nanoseconds.  Every denoising
step ends with the sampler's statistics kernel (`stats_kernel`), so the
launches after the N-th such kernel up to and including the (N+1)-th are
step N + 1 (N = 1 by default: the second step profiled, past the first
one's one-time work; N = 0: everything up to the first).

Prints two Markdown tables: the step's launches in groups (the groups the
notes use: the experts' GEMMs, attention, sampler, ...; rules below, the
first that matches a kernel's name wins; anything else is its own group),
with launches and microseconds, and the K kernels (by name and grid) that
took longest, with launches, microseconds and microseconds a launch.
Totals at the bottom of the first.  Exits 1 on a file without enough
statistics kernels to bound the step asked for.
"""
import argparse
import csv
import re
import sys

# (group, pattern on the kernel's name); the first match wins
GROUPS = [
    ("experts' grouped GEMMs", r"^grouped_gemm_kernel|^fp8_gemm_kernel|^grouped_wgmma_kernel"
     r"|^fp8_wgmma_kernel"),
    ("attention", r"^attention"),
    ("sampler (statistics, probabilities, fold)", r"^stats_kernel|^probs_(vec_)?kernel|^fold_kernel"),
    ("row kernels (RMSNorm, add, feed-forward combine)", r"^rmsnorm|^ffn_combine"),
    ("q, k, v norms, RoPE, KV append", r"^head_norm_rope|^rope_kernel|^kv_append"),
    ("router", r"^router"),
    ("routing, gather, combine", r"^route_kernel|^count_kernel|^schedule_kernel|^fill_kernel"
     r"|^gather|^combine"),
    ("gelu (dense and SC MLP), embedding, rows gather", r"^gelu_mul|^embed|^rows_gather"),
    ("FP8 activations quantized, cuBLASLt outputs scaled", r"^quantize_rows|^lt_scale"),
    ("cuBLAS / cuBLASLt GEMMs", r"^nvjet|^cublas|^sm90_|^cutlass"),
]


def short(name):
    """The kernel's name without its argument list and return type."""
    name = re.sub(r"\(.*", "", name)
    return re.sub(r"^void ", "", name).strip()


def group_of(name):
    for g, pat in GROUPS:
        if re.search(pat, name):
            return g
    return name


def read_launches(path):
    """[(name, grid, block, microseconds)] in launch order."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    out = []
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        ns = float(row["Metric Value"].replace(",", ""))
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
                 "msecond": 1e3}.get(row.get("Metric Unit", "ns"), 1e-3)
        out.append((short(row["Kernel Name"]), row.get("Grid Size", ""),
                    row.get("Block Size", ""), ns * scale))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--step", type=int, default=1)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    launches = read_launches(a.csv)
    ends = [i for i, k in enumerate(launches) if k[0].startswith("stats_kernel")]
    if a.step < 0 or len(ends) < a.step + 1:
        print(f"step_kernels.py: {a.csv}: {len(ends)} sampler statistics kernels, too few "
              f"to bound step {a.step + 1}", file=sys.stderr)
        return 1
    step = launches[(ends[a.step - 1] + 1 if a.step > 0 else 0):ends[a.step] + 1]

    groups, kernels = {}, {}
    for name, grid, block, us in step:
        g = groups.setdefault(group_of(name), [0, 0.0])
        g[0] += 1
        g[1] += us
        k = kernels.setdefault((name, grid, block), [0, 0.0])
        k[0] += 1
        k[1] += us
    total = sum(us for *_, us in step)

    print(f"denoising step {a.step + 1} of {a.csv}: {len(step)} launches, "
          f"{total:,.1f} us (each launch alone)\n")
    print("| group | launches | us | share |\n|---|---:|---:|---:|")
    for g, (n, us) in sorted(groups.items(), key=lambda kv: -kv[1][1]):
        print(f"| {g} | {n} | {us:,.1f} | {100 * us / total:.1f}% |")
    print(f"| **total** | **{len(step)}** | **{total:,.1f}** | 100% |\n")
    print("| kernel | grid | block | launches | us | us a launch |\n|---|---|---|---:|---:|---:|")
    for (name, grid, block), (n, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1])[:a.top]:
        print(f"| `{name}` | {grid} | {block} | {n} | {us:,.1f} | {us / n:,.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
