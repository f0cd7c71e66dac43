#!/usr/bin/env python3
"""The performance harness's table (bench/perf/run.sh writes its inputs).

usage: report.py OUTDIR

Reads OUTDIR/tp1.json (and tp1-fp8.json, tp2.json, tp4.json if there),
profile.json (and profile-tp2.json, profile-tp4.json if there) and hf.json;
prints one table (per engine, TP and batch: the denoising step and
the commit -- for dgemma the step is its denoise call and its
self-conditioning call (the probabilities and P E for the next step),
which transformers' decoder forward does within itself (on one GPU the
denoise call queues that work behind its results and the next denoise
call waits for it: the two calls' sum is the step either way), and the commit
what a step that commits the canvas before it takes beyond one that does
not, the two being one pass (as rank 0's GPU timed each call's own work,
bench-generate's option time_steps: not what a call waited for behind the
one before it); for transformers its encoder pass --, the
roofline of the denoising step measured in the same run,
committed tokens/s without and with the prefill, GPU memory per rank, the
ratio to Hugging Face at the same batch, FP8's to bf16 and TP=N's to TP=1
with the same weights) and the sampler + self-conditioning share of a
batch-1 denoising step at each TP profiled; and, from OUTDIR/gpu.txt,
OUTDIR/board.csv and OUTDIR/clocks.csv (run.sh's), which GPU ran it (its
board: VBIOS and InfoROM, and the driver) and its clocks, power and
temperature while it was busy: the same code reads apart on two starts of
the same kind when those differ; where the samples are timed (nvidia-smi's
timestamp field) and the runs' JSON rows say when they ran
(started_unix_s, ended_unix_s), a second table gives the same for the
samples within each dgemma run, so that a row read with the clock held
down (the power cap) can be told.  Writes OUTDIR/perf.json (all of it) and
OUTDIR/tokens_per_s.png (tokens/s against batch size, when matplotlib is
there).
"""
import json
import os
import statistics
import sys
import time

# nvidia-smi's clock event reasons (a bit mask) that say why a clock is
# below its most; idle (0x1) is not one while the GPU is busy
REASONS = ((0x2, "applications clocks setting"), (0x4, "SW power cap"),
           (0x8, "HW slowdown"), (0x10, "sync boost"), (0x20, "SW thermal slowdown"),
           (0x40, "HW thermal slowdown"), (0x80, "HW power brake slowdown"),
           (0x100, "display clock setting"))
BUSY_PCT = 50  # a sample counts as busy at this utilization or more


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def sample_time(stamp):
    """nvidia-smi's timestamp ("2026/12/07 06:41:18.882", the machine's local
    time) as seconds since 1970, or None if it does not parse."""
    try:
        whole, _, frac = stamp.partition(".")
        return time.mktime(time.strptime(whole, "%Y/%m/%d %H:%M:%S")) + float("0." + (frac or "0"))
    except (ValueError, OverflowError):
        return None


def busy_samples(out):
    """clocks.csv's samples at utilization.gpu >= BUSY_PCT, each a dict of
    its fields (and "t", seconds since 1970, where the samples are timed),
    or None without clocks.csv or its first line.

    clocks.csv: a first line "# field,field,..." naming the columns that
    follow (nvidia-smi --query-gpu=those --format=csv,noheader,nounits, one
    line a GPU a second); lines that do not parse (nvidia-smi's own
    messages, "[N/A]") are passed over."""
    try:
        with open(os.path.join(out, "clocks.csv")) as f:
            text = f.read().splitlines()
    except FileNotFoundError:
        return None
    if not text or not text[0].startswith("# "):
        return None
    fields = [x.strip() for x in text[0][2:].split(",")]
    busy = []
    for ln in text[1:]:
        cells = [x.strip() for x in ln.split(",")]
        if len(cells) != len(fields):
            continue
        row = dict(zip(fields, cells))
        try:
            if float(row["utilization.gpu"]) < BUSY_PCT:
                continue
        except (KeyError, ValueError):
            continue
        if "timestamp" in row:
            row["t"] = sample_time(row["timestamp"])
        busy.append(row)
    return busy


def conditions(busy):
    """Over the samples busy (busy_samples' rows): their count, the medians,
    least and most of the SM and memory clocks and the power, the hottest
    temperature, and (where the reasons were recorded) for each clock event
    reason how many samples had it."""
    g = dict(busy_samples=len(busy))

    def spread(key):
        v = []
        for row in busy:
            try:
                v.append(float(row[key]))
            except (KeyError, ValueError):
                pass
        return dict(median=statistics.median(v), min=min(v), max=max(v)) if v else None
    g["sm_mhz"], g["mem_mhz"] = spread("clocks.sm"), spread("clocks.mem")
    g["power_w"], temp = spread("power.draw"), spread("temperature.gpu")
    g["temp_c_max"] = temp["max"] if temp else None
    # (older drivers call the reasons clocks_throttle_reasons)
    key = next((k for k in ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
                if busy and k in busy[0]), None)
    if key:
        reasons = {}
        for row in busy:
            try:
                mask = int(row[key], 16)
            except ValueError:
                continue
            for bit, why in REASONS:
                if mask & bit:
                    reasons[why] = reasons.get(why, 0) + 1
        g["reasons"] = reasons
    return g


def gpu_conditions(out, busy):
    """Which GPU ran the harness and its clocks while busy (conditions over
    busy, busy_samples' answer), or None.  gpu.txt: nvidia-smi's CSV lines,
    one a GPU, the name first."""
    try:
        with open(os.path.join(out, "gpu.txt")) as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except FileNotFoundError:
        lines = []
    names = [ln.split(",")[0].strip() for ln in lines if "," in ln]
    if not names:
        return None
    g = dict(name=names[0], count=len(names), busy_samples=0)
    if busy is not None:
        g.update(conditions(busy))
    return g


def gpu_boards(out):
    """Which board each GPU is, from board.csv (run.sh's: nvidia-smi's
    index, VBIOS, InfoROM image and driver, one line a GPU): a list of
    dicts with those four, or None where the file is missing or holds no
    such line (an nvidia-smi that refused the query)."""
    try:
        with open(os.path.join(out, "board.csv")) as f:
            lines = [ln.strip() for ln in f if ln.strip()]
    except FileNotFoundError:
        return None
    boards = []
    for ln in lines:
        parts = [p.strip() for p in ln.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            boards.append(dict(index=int(parts[0]), vbios=parts[1], inforom=parts[2],
                               driver=parts[3]))
    return boards or None


def say_boards(boards):
    """The line report.py prints about gpu_boards' answer: one board where
    every GPU's is the same, else each GPU's."""
    if not boards:
        return "board: not recorded (no board.csv, or nvidia-smi refused its query)"
    def one(b):
        return f"VBIOS {b['vbios']}, InfoROM {b['inforom']}"
    kinds = {one(b) for b in boards}
    if len(kinds) == 1:
        s = one(boards[0]) + (f" (all {len(boards)} GPUs)" if len(boards) > 1 else "")
    else:
        s = "; ".join(f"GPU {b['index']}: {one(b)}" for b in boards)
    return f"board: {s}; driver {boards[0]['driver']}"


def during(busy, run):
    """conditions() over the busy samples timed within a run's started_unix_s
    and ended_unix_s, or None where the samples or the run are not timed."""
    t0, t1 = run.get("started_unix_s"), run.get("ended_unix_s")
    if not busy or t0 is None or t1 is None or busy[0].get("t") is None:
        return None
    return conditions([r for r in busy if r.get("t") is not None and t0 <= r["t"] <= t1])


def say_gpu(g):
    """The line report.py prints about gpu_conditions' answer."""
    if not g:
        return "GPU: not recorded (no gpu.txt)"
    s = f"GPU: {g['name']} x {g['count']}"
    if not g["busy_samples"]:
        return s + "; no clock samples while busy"
    s += f"; while busy ({g['busy_samples']} samples at >= {BUSY_PCT}% utilization):"
    if g["sm_mhz"]:
        c = g["sm_mhz"]
        s += f" SM clock median {c['median']:.0f} MHz ({c['min']:.0f}-{c['max']:.0f}),"
    if g["mem_mhz"]:
        c = g["mem_mhz"]
        s += f" memory {c['median']:.0f} MHz ({c['min']:.0f}-{c['max']:.0f}),"
    if g["power_w"]:
        s += f" power median {g['power_w']['median']:.0f} W (most {g['power_w']['max']:.0f}),"
    if g["temp_c_max"] is not None:
        s += f" hottest {g['temp_c_max']:.0f} C,"
    if "reasons" in g:
        s += " clock event reasons: " + (", ".join(
            f"{why} ({g['reasons'][why]})" for _, why in REASONS if why in g["reasons"])
            or "none")
    return s.rstrip(",")


def main():
    out = sys.argv[1]
    busy = busy_samples(out)
    gpu = gpu_conditions(out, busy)
    runs = {}  # (tp, weights) -> bench-generate's JSON
    for tp in (1, 2, 4):
        for w, suffix in (("bf16", ""), ("fp8", "-fp8")):
            d = load(os.path.join(out, f"tp{tp}{suffix}.json"))
            if d:
                runs[(tp, w)] = d
    hf = load(os.path.join(out, "hf.json")) or {"runs": []}
    profs = {}  # tp -> bench-generate --profile's JSON
    for tp in (1, 2, 4):
        d = load(os.path.join(out, "profile.json" if tp == 1 else f"profile-tp{tp}.json"))
        if d:
            profs[tp] = d
    hf_by_b = {r["batch"]: r for r in hf["runs"]}
    ceil = next((d["ceilings"] for d in runs.values() if "ceilings" in d), {})
    tps = {(tp, w, r["batch"]): r["tokens_per_s"] for (tp, w), d in runs.items()
           for r in d["runs"]}
    print()
    print(say_gpu(gpu))
    boards = gpu_boards(out)
    print(say_boards(boards))
    l2 = f", L2 read {ceil['l2_read_gbps']:.0f} GB/s" if "l2_read_gbps" in ceil else ""
    print(f"ceilings: copy {ceil.get('copy_gbps', 0):.0f} GB/s, bf16 GEMM "
          f"{ceil.get('gemm_tflops', 0):.0f} TFLOP/s{l2}; prompt 512, 4 canvases of 256, "
          "16 steps")
    print()
    print("| engine | weights | TP | B | step ms | roofline ms | % of roofline | commit ms | "
          "tok/s | tok/s with prefill | GiB/rank | x HF tok/s | x bf16 tok/s | x TP=1 tok/s |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    table = []
    for (tp, w), d in runs.items():
        for r in d["runs"]:
            h = hf_by_b.get(r["batch"])
            ratio = r["tokens_per_s"] / h["tokens_per_s"] if h else None
            base = tps.get((tp, "bf16", r["batch"])) if w == "fp8" else None
            one = tps.get((1, w, r["batch"])) if tp > 1 else None
            # a step whole: the denoise call and the condition call
            step = r["denoise_ms"] + r["condition_ms"]
            row = dict(engine="dgemma", weights=w, tp=tp, batch=r["batch"],
                       step_ms=step, denoise_ms=r["denoise_ms"],
                       condition_ms=r["condition_ms"],
                       roofline_ms=r["roofline_denoise_ms"],
                       pct_roofline=100 * r["roofline_denoise_ms"] / step,
                       commit_ms=r["commit_ms"], tokens_per_s=r["tokens_per_s"],
                       tokens_per_s_with_prefill=r["tokens_per_s_with_prefill"],
                       gib_per_rank=max(r["gpu_gib_per_rank"]), ratio_hf=ratio,
                       ratio_bf16=r["tokens_per_s"] / base if base else None,
                       ratio_tp1=r["tokens_per_s"] / one if one else None,
                       gpu_while_running=during(busy, r))
            table.append(row)
            print(f"| dgemma | {w} | {tp} | {r['batch']} | {step:.2f} | "
                  f"{r['roofline_denoise_ms']:.2f} | {row['pct_roofline']:.0f}% | "
                  f"{r['commit_ms']:.2f} | {r['tokens_per_s']:.0f} | "
                  f"{r['tokens_per_s_with_prefill']:.0f} | {row['gib_per_rank']:.1f} | "
                  + (f"{ratio:.2f}" if ratio else "") + " | "
                  + (f"{row['ratio_bf16']:.2f}" if row["ratio_bf16"] else "") + " | "
                  + (f"{row['ratio_tp1']:.2f}" if row["ratio_tp1"] else "") + " |")
    for h in hf["runs"]:
        table.append(dict(engine="transformers", weights="bf16", tp=1, batch=h["batch"],
                          step_ms=h["denoise_ms"], denoise_ms=h["denoise_ms"],
                          commit_ms=h["commit_ms"],
                          tokens_per_s=h["tokens_per_s"],
                          tokens_per_s_with_prefill=h["tokens_per_s_with_prefill"],
                          gib_per_rank=h["gpu_gib"]))
        print(f"| transformers 5.17 | bf16 | 1 | {h['batch']} | {h['denoise_ms']:.2f} | | | "
              f"{h['commit_ms'] or 0:.2f} | {h['tokens_per_s']:.0f} | "
              f"{h['tokens_per_s_with_prefill']:.0f} | {h['gpu_gib']:.1f} | 1.00 | | |")
    if hf.get("stopped"):
        print(f"(transformers stopped at batch {hf['stopped']['batch']}: "
              f"{hf['stopped']['why']})")
    # the clocks within each run, where the samples and the runs are timed
    timed = [(r["weights"], r["tp"], r["batch"], r["gpu_while_running"]) for r in table
             if r.get("gpu_while_running") is not None]
    prof_gpu = {}
    for tp, prof in sorted(profs.items()):
        c = during(busy, prof["runs"][0]) if prof["runs"] else None
        if c is not None:
            prof_gpu[str(tp)] = c
            timed.append(("bf16, profiled", tp, prof["runs"][0]["batch"], c))
    if timed:
        print()
        print(f"clocks while each dgemma run ran (its samples at >= {BUSY_PCT}% utilization):")
        print("| weights | TP | B | samples | SM clock MHz, median (least-most) | "
              "power W, median (most) | clock event reasons |")
        print("|---|---|---|---:|---|---|---|")
        for w, tp, b, c in timed:
            sm, pw = c.get("sm_mhz"), c.get("power_w")
            print(f"| {w} | {tp} | {b} | {c['busy_samples']} | "
                  + (f"{sm['median']:.0f} ({sm['min']:.0f}-{sm['max']:.0f})" if sm else "")
                  + " | " + (f"{pw['median']:.0f} ({pw['max']:.0f})" if pw else "") + " | "
                  + (", ".join(f"{why} ({c['reasons'][why]})" for _, why in REASONS
                               if why in c["reasons"]) or "none" if "reasons" in c else "")
                  + " |")
    shares = {}  # tp -> sampler + self-conditioning % of a batch-1 step
    for tp, prof in sorted(profs.items()):
        if not prof["runs"] or "profile_ms_per_step" not in prof["runs"][0]:
            continue
        p = prof["runs"][0]["profile_ms_per_step"]
        total = sum(p.values())
        part = sum(v for k, v in p.items()
                   if k.startswith("sampler") or k == "self-conditioning P.E")
        shares[tp] = 100 * part / total
        print()
        print(f"sampler + self-conditioning reduce: {part:.3f} of {total:.3f} ms per batch-1 "
              f"denoising step at TP={tp} (profiled, eager, rank 0): {shares[tp]:.1f}%")
    with open(os.path.join(out, "perf.json"), "w") as f:
        json.dump(dict(gpu=gpu, boards=boards, ceilings=ceil, rows=table, sampler_share_pct_tp1_b1=shares.get(1),
                       sampler_share_pct_b1={str(tp): v for tp, v in shares.items()},
                       profile=profs.get(1), gpu_while_profiled=prof_gpu,
                       profiles={str(tp): d for tp, d in profs.items()}), f, indent=1)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import LogFormatterSciNotation
    except ImportError:
        print("report.py: no matplotlib: no plot", file=sys.stderr)
        return 0
    fig, ax = plt.subplots(figsize=(6, 4), dpi=120)
    for (tp, w) in runs:
        rs = [r for r in table
              if r["engine"] == "dgemma" and r["tp"] == tp and r["weights"] == w]
        ax.plot([r["batch"] for r in rs], [r["tokens_per_s"] for r in rs],
                "o-" if w == "bf16" else "^-", label=f"dgemma TP={tp} {w}")
    hs = [r for r in table if r["engine"] == "transformers"]
    ax.plot([r["batch"] for r in hs], [r["tokens_per_s"] for r in hs], "s--",
            label="transformers 5.17 (TP=1)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    # (the values between the decades labelled whatever matplotlib's defaults)
    ax.yaxis.set_minor_formatter(LogFormatterSciNotation(labelOnlyBase=False,
                                                         minor_thresholds=(2, 1)))
    ax.set_xlabel("batch (requests)")
    ax.set_ylabel("committed tokens/s (excluding prefill)")
    ax.set_title("DiffusionGemma 26B-A4B, random weights, "
                 + (f"{gpu['name']} x {gpu['count']}" if gpu else "GPU not recorded"),
                 fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out, "tokens_per_s.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
