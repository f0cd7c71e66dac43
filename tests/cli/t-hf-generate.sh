#!/usr/bin/env bash
# Description: bench/perf/hf_generate.py's bookkeeping, with stand-ins for
# torch and transformers written here (a model whose generate calls the
# denoising forward S times a canvas and the encoder once a canvas, at a
# pace that changes from one generate to the next): --best-of 3 runs three
# timed generates at batch sizes up to --best-of-upto (default 4) and one
# above, keeps the one with the most tokens/s and lists every try's in
# hf.json; the kept run counts the tokens and the denoising calls of the
# workload; --best-of-upto 0 leaves one try everywhere; --best-of 0 is a
# usage error (exit 2).  The model is built with the encoder's text stack
# made on the meta device, its parameter tied to the decoder's by the
# (stand-in) library and its buffer a copy of the decoder's: the stand-in's
# generate refuses to run otherwise; a parameter the library leaves untied
# ends the script (exit 1, "not tied").  A batch that runs out of GPU
# memory ends the runs there: the batches before it are in hf.json, with
# "stopped" naming it, and the exit status is 0.  Skips (77) without
# python3.
set -u
command -v python3 >/dev/null 2>&1 || { echo "skip t-hf-generate: no python3"; exit 77; }
. "${0%/*}/cli-lib.sh" t-hf-generate
S=${0%/*}/../../bench/perf/hf_generate.py

mkdir -p "$tmp/mods/transformers/models/diffusion_gemma"
cat > "$tmp/mods/torch.py" <<'PY'
import contextlib
bfloat16, float32 = "bf16", "f32"
_device = ["cpu"]  # the default device, innermost context last
def set_default_dtype(d): pass
@contextlib.contextmanager
def device(d):
    _device.append(d)
    try:
        yield
    finally:
        _device.pop()
@contextlib.contextmanager
def no_grad(): yield
def manual_seed(s): pass
class OutOfMemoryError(RuntimeError): pass
class Generator:
    def manual_seed(self, s): return self
class Tensor:
    def __init__(self, shape, value=0):
        self.shape, self.value, self.is_meta = shape, value, _device[-1] == "meta"
    def cuda(self): return self
    def clone(self):
        with device("cuda"):
            return Tensor(self.shape, self.value)
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
echo 'from .modeling_diffusion_gemma import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion' \
    > "$tmp/mods/transformers/models/diffusion_gemma/__init__.py"
cat > "$tmp/mods/transformers/models/diffusion_gemma/modeling_diffusion_gemma.py" <<'PY'
import os
import time
import torch
CANVAS = 8
class DiffusionGemmaConfig:
    def __init__(self, **kw): self.canvas_length = CANVAS
    def get_text_config(self):
        class Text: vocab_size = 1000
        return Text()
class Stack:  # a text stack: one parameter, one buffer (the layer scalar)
    def __init__(self):
        self.w, self._buffers = torch.Tensor((2,)), {"layer_scalar": torch.Tensor((1,), 7)}
class DiffusionGemmaEncoderTextModel(Stack):
    def __init__(self, cfg):
        super().__init__()
        self.built_on = torch._device[-1]
class Encoder:
    def __init__(self, cfg): self.language_model = DiffusionGemmaEncoderTextModel(cfg)
    def forward(self, *a, **kw): return None
class Inner:
    def __init__(self, cfg): self.encoder, self.decoder = Encoder(cfg), Stack()
class DiffusionGemmaForBlockDiffusion:
    generates = 0
    def __init__(self, cfg):
        self.model = Inner(cfg)
        if not os.environ.get("STUB_UNTIED"):  # the library ties the encoder's to the decoder's
            self.model.encoder.language_model.w = self.model.decoder.w
    def named_parameters(self, remove_duplicate=True):
        return [("model.decoder.w", self.model.decoder.w),
                ("model.encoder.language_model.w", self.model.encoder.language_model.w)]
    def named_buffers(self, remove_duplicate=True):
        return [(p + ".layer_scalar", m._buffers["layer_scalar"])
                for p, m in (("model.decoder", self.model.decoder),
                             ("model.encoder.language_model", self.model.encoder.language_model))]
    def get_submodule(self, name):
        o = self
        for part in name.split("."):
            o = getattr(o, part)
        return o
    def eval(self): return self
    def forward(self, *a, **kw):
        time.sleep(0.001 * self.pace)
    def generate(self, prompt, max_new_tokens, max_denoising_steps, **kw):
        enc, dec = self.model.encoder.language_model, self.model.decoder
        b = enc._buffers["layer_scalar"]
        if enc.built_on != "meta" or enc.w is not dec.w or b.is_meta or b.value != 7:
            raise SystemExit("stand-in: the encoder's text stack was not made on the meta "
                             "device, tied, and given the decoder's buffers")
        if prompt.shape[0] >= int(os.environ.get("STUB_OOM_AT", 1 << 30)):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
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
if STUB_OOM_AT=16 run oom 0 hf "$tmp/oom.json" --batches 1 4 16 32 --prompt 5 --canvases 1 \
    --steps 2; then
    got=$(summary "$tmp/oom.json" | tr '\n' ';')
    stopped=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["stopped"])' \
        "$tmp/oom.json")
    [ "$got" = "1 1 1 8 2;4 1 1 32 2;" ] && [ "$stopped" = "{'batch': 16, 'why': 'out of GPU memory: CUDA out of memory'}" ] &&
        has oom out "hf: batch 16: out of GPU memory" && ok out_of_memory_keeps_the_rest ||
        bad out_of_memory_keeps_the_rest "$got / $stopped"
fi
STUB_UNTIED=1 run untied 1 hf "$tmp/untied.json" --batches 1 && has untied err "were not tied" &&
    [ ! -e "$tmp/untied.json" ] && ok untied_refused || bad untied_refused "$(tail -n 2 "$tmp/untied.err")"

[ $fails -eq 0 ]
