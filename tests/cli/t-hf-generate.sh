#!/usr/bin/env bash
# Description: bench/perf/hf_generate.py's bookkeeping, with stand-ins for
# torch and transformers written here (a model whose generate calls the
# denoising forward S times a canvas and the encoder once a canvas, at a
# pace that changes from one generate to the next): --best-of 3 runs three
# timed generates at batch sizes up to --best-of-upto (default 4) and one
# above, keeps the one with the most tokens/s and lists every try's in
# hf.json; the kept run counts the tokens and the denoising calls of the
# workload; --best-of-upto 0 leaves one try everywhere; --best-of 0 is a
# usage error (exit 2).  Skips (77) without python3.
set -u
command -v python3 >/dev/null 2>&1 || { echo "skip t-hf-generate: no python3"; exit 77; }
. "${0%/*}/cli-lib.sh" t-hf-generate
S=${0%/*}/../../bench/perf/hf_generate.py

mkdir -p "$tmp/mods/transformers/models/diffusion_gemma"
cat > "$tmp/mods/torch.py" <<'PY'
import contextlib
bfloat16, float32 = "bf16", "f32"
def set_default_dtype(d): pass
@contextlib.contextmanager
def device(d): yield
@contextlib.contextmanager
def no_grad(): yield
def manual_seed(s): pass
class Generator:
    def manual_seed(self, s): return self
class Tensor:
    def __init__(self, shape): self.shape = shape
    def cuda(self): return self
def randint(lo, hi, shape, generator=None): return Tensor(shape)
class cuda:
    synchronize = staticmethod(lambda: None)
    reset_peak_memory_stats = staticmethod(lambda: None)
    max_memory_allocated = staticmethod(lambda: 3 << 30)
PY
cat > "$tmp/mods/transformers/__init__.py" <<'PY'
class Gemma4VisionConfig:
    def to_dict(self): return {}
PY
: > "$tmp/mods/transformers/models/__init__.py"
cat > "$tmp/mods/transformers/models/diffusion_gemma/__init__.py" <<'PY'
import time
import torch
CANVAS = 8
class DiffusionGemmaConfig:
    def __init__(self, **kw): self.canvas_length = CANVAS
    def get_text_config(self):
        class Text: vocab_size = 1000
        return Text()
class Encoder:
    def forward(self, *a, **kw): return None
class Inner:
    def __init__(self): self.encoder = Encoder()
class DiffusionGemmaForBlockDiffusion:
    generates = 0
    def __init__(self, cfg): self.model = Inner()
    def eval(self): return self
    def forward(self, *a, **kw):
        time.sleep(0.001 * self.pace)
    def generate(self, prompt, max_new_tokens, max_denoising_steps, **kw):
        DiffusionGemmaForBlockDiffusion.generates += 1
        self.pace = 1 + self.generates % 3
        self.model.encoder.forward()
        for _ in range(max_new_tokens // CANVAS):
            for _ in range(max_denoising_steps):
                self.forward(decoder_input_ids=0)
            self.model.encoder.forward()
        return torch.Tensor((prompt.shape[0], prompt.shape[1] + max_new_tokens))
PY
echo '{"architectures": ["DiffusionGemmaForBlockDiffusion"]}' > "$tmp/config.json"
hf() { PYTHONPATH="$tmp/mods" python3 "$S" "$tmp/config.json" "$@"; }

# (batch, tries, kept tokens/s is the largest, tokens, denoising calls) a line
summary() {
    python3 -c 'import json, sys
for r in json.load(open(sys.argv[1]))["runs"]:
    print(r["batch"], len(r["tries"]), int(r["tokens_per_s"] == max(r["tries"])), r["tokens"],
          r["denoise_calls"])' "$1"
}

if run best 0 hf "$tmp/best.json" --batches 1 4 16 --prompt 5 --canvases 2 --steps 3 --best-of 3
then
    got=$(summary "$tmp/best.json" | tr '\n' ';')
    [ "$got" = "1 3 1 16 6;4 3 1 64 6;16 1 1 256 6;" ] && ok best_of_three ||
        bad best_of_three "$got"
    [ "$(grep -c '^hf: batch 1:' "$tmp/best.out")" = 3 ] && ok each_try_printed ||
        bad each_try_printed "$(grep '^hf: batch' "$tmp/best.out")"
fi
if run upto 0 hf "$tmp/upto.json" --batches 1 4 --prompt 5 --canvases 1 --steps 2 --best-of 3 \
    --best-of-upto 0; then
    got=$(summary "$tmp/upto.json" | tr '\n' ';')
    [ "$got" = "1 1 1 8 2;4 1 1 32 2;" ] && ok upto_zero || bad upto_zero "$got"
fi
run zero 2 hf "$tmp/zero.json" --best-of 0 && has zero err "--best-of" && ok best_of_zero ||
    bad best_of_zero "$(cat "$tmp/zero.err")"

[ $fails -eq 0 ]
