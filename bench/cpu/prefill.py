#!/usr/bin/env python3
"""The CPU backend's time for one long prompt: prefill and the first canvas.

    bench/cpu/prefill.py [--model DIR] [--reps N] [--base OTHER_DGEMMA_EVAL]
                         [--tp T] LENGTH...

For each prompt length (characters of a `reverse` problem of random
letters, so about as many tokens on the default model's character-level
tokenizer), runs `dgemma-eval generate --json` (build/bin, seed 1, at most
32 new tokens) REPS times and prints a table of the medians of its
ms_prefill and ms_total.  With --base, an older dgemma-eval runs the same
requests interleaved with this one (base, this, base, this, ...), the
table gains its medians and the ratio, and the two runs' generated ids are
compared (they must be the same for a change that keeps the bits).
"""
import argparse
import json
import random
import statistics
import subprocess
import sys


def run(binary, model, prompt, tp):
    out = subprocess.run([binary, "generate", "--model", model, "--prompt", prompt, "--seed", "1",
                          "--max-tokens", "32", "--tp", str(tp), "--json"],
                         check=True, capture_output=True, text=True).stdout
    d = json.loads(out)
    return d["ms_prefill"], d["ms_total"], d["ids"], d["prompt_tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lengths", type=int, nargs="+")
    ap.add_argument("--model", default="build/model/default")
    ap.add_argument("--bin", default="build/bin/dgemma-eval")
    ap.add_argument("--base")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tp", type=int, default=1)
    a = ap.parse_args()
    rng = random.Random(1)
    rows = []
    same = True
    for n in a.lengths:
        prompt = "reverse " + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                                      for _ in range(max(n - 8, 1)))
        this, base = [], []
        for _ in range(a.reps):
            if a.base:
                base.append(run(a.base, a.model, prompt, a.tp))
            this.append(run(a.bin, a.model, prompt, a.tp))
        med = lambda runs, i: statistics.median(r[i] for r in runs)
        row = [n, this[0][3], med(this, 0), med(this, 1)]
        if a.base:
            row += [med(base, 0), med(base, 1), med(base, 1) / med(this, 1)]
            same &= all(r[2] == this[0][2] for r in this + base)
        rows.append(row)
    head = "| characters | prompt tokens | prefill ms | total ms |"
    rule = "|---:|---:|---:|---:|"
    if a.base:
        head += " base prefill ms | base total ms | base / this (total) |"
        rule += "---:|---:|---:|"
    print("medians of %d runs each%s, tp %d, model %s" %
          (a.reps, ", interleaved with --base" if a.base else "", a.tp, a.model))
    print(head)
    print(rule)
    for r in rows:
        cells = ["%d" % r[0], "%d" % r[1]] + ["%.0f" % x for x in r[2:4]]
        if a.base:
            cells += ["%.0f" % r[4], "%.0f" % r[5], "%.2f" % r[6]]
        print("| " + " | ".join(cells) + " |")
    if a.base:
        print("generated ids: %s" % ("the same in every run" if same else "DIFFERENT"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
