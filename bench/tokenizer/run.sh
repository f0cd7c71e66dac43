#!/usr/bin/env bash
# bench/tokenizer/run.sh - the C tokenizer beside Hugging Face's Rust engine
# (npm tokenizers@0.23.2) on the same machine, same files, one run:
# load time of the Gemma tokenizer.json (33 MB) and single-thread encode
# throughput on two corpora.  Medians of LOADS loads and ENCODES encodes.
#
# usage: bench/tokenizer/run.sh [LOADS] [ENCODES]
# Needs node and npm (the npm registry, once, to install the oracle's
# packages into $BUILD/bench/tokenizer/node) and ../shared beside the repo.
# Not a test: it prints a table and asserts nothing.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
SHARED=${DG_SHARED:-../shared}
ORACLE=$SHARED/oracle/tokenizer
LOADS=${1:-7}
ENCODES=${2:-7}
NODE_DIR=$BUILD/bench/tokenizer/node

make --no-print-directory bench-build >/dev/null
if [ ! -d "$NODE_DIR/node_modules/tokenizers" ]; then
    mkdir -p "$NODE_DIR"
    cp "$ORACLE/package.json" "$ORACLE/package-lock.json" "$NODE_DIR/"
    (cd "$NODE_DIR" && npm ci --silent >/dev/null)
fi
cp bench/tokenizer/bench-hf.js "$NODE_DIR/"

# corpus 2: the shared oracle's case texts, repeated to 1 MB (prose-heavy)
PROSE=$BUILD/bench/tokenizer/oracle-texts-1mb.txt
python3 - "$ORACLE/cases.jsonl" "$PROSE" <<'PY'
import json, sys
texts = [json.loads(l).get("text", "") for l in open(sys.argv[1])]
s = "".join(t for t in texts if t)
b = (s * (1_000_000 // len(s.encode()) + 1)).encode()[:1_000_000].decode("utf-8", "ignore")
open(sys.argv[2], "w", newline="").write(b)
PY

export RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(date -u +%F)"
printf '%-22s %-26s %9s %10s %9s %9s\n' corpus engine "load s" "encode s" "MB/s" tokens
for corpus in tests/fixtures/tokenizer/mixed-1mb.txt "$PROSE"; do
    name=$(basename "$corpus" .txt)
    c=$("$BUILD/bench/tokenizer/bench-tokenizer" "$ORACLE/tokenizer.json" "$corpus" "$LOADS" "$ENCODES")
    h=$(node "$NODE_DIR/bench-hf.js" "$ORACLE/tokenizer.json" "$corpus" "$LOADS" "$ENCODES")
    for line in "$c" "$h"; do
        python3 -c "
import json, sys
d = json.loads(sys.argv[1])
print('%-22s %-26s %9.3f %10.4f %9.2f %9d' % (sys.argv[2], d['engine'], d['load_s'], d['encode_s'], d['mb_per_s'], d['tokens']))
" "$line" "$name"
    done
    python3 -c "
import json, sys
c, h = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print('%-22s %-26s %9.2fx %9.2fx  (dgemma vs HF; same token count: %s)' % ('', 'ratio', h['load_s'] / c['load_s'], c['mb_per_s'] / h['mb_per_s'], c['tokens'] == h['tokens']))
" "$c" "$h"
done
