#!/usr/bin/env python3
"""Record Hugging Face's diffusion sampler, step by step, for dgemma's parity test.

Runs DiffusionGemmaForBlockDiffusion.generate (transformers 5.17.0, float32,
CPU) on the committed golden checkpoints (tests/golden/golden-a, golden-b) under
several generation settings, and records every decision the sampler takes:

  per canvas:  the random initial canvas
  per step:    cur_step and the temperature (float32, exact), the canvas fed
               to the decoder, the decoder's raw logits (into CASE-logits.npy),
               the multinomial sample (the denoiser canvas), the uniform ids
               drawn for renoising, the acceptance mask, the argmax canvas,
               the per-position entropies, the stable / confident flags and
               whether denoising finished
  per canvas:  the emitted (argmax) canvas; at the end, the returned sequence

dgemma's test (tests/unit/t-sampler-hf.c) replays these: from HF's logits and
HF's random draws it must reach the same temperatures, argmax canvases,
acceptance masks, next canvases, stability history and stop step.

Entries are captured by wrapping HF's own objects (model.forward, the
sampler's initialize_canvas / accept_canvas, the stopping criterion and the
temperature processor); nothing of the algorithm is re-implemented here.

usage: python3 tests/hf/make_sampler_goldens.py GOLDEN_DIR OUTDIR
       (GOLDEN_DIR holds golden-a/checkpoint and golden-b/checkpoint)
"""

import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers.models.diffusion_gemma import DiffusionGemmaForBlockDiffusion
from transformers.models.diffusion_gemma import generation_diffusion_gemma as G

# name -> model, torch seed, settings.  Together: few accepted (beta 0.1),
# many accepted, everything accepted, s = 0 / 1 / 2, stops on stability and
# confidence, stable but never confident, stops at the step cap, several
# canvases past the sliding window, and an EOS mid-canvas.
CASES = {
    "cap": ("golden-a", 11, dict(max_new_tokens=32, max_denoising_steps=10, entropy_bound=0.1,
                                  t_min=0.4, t_max=0.8, stability_threshold=1,
                                  confidence_threshold=0.005)),
    "beta-wide": ("golden-a", 12, dict(max_new_tokens=16, max_denoising_steps=6,
                                        entropy_bound=8.0, t_min=0.4, t_max=0.8,
                                        stability_threshold=1, confidence_threshold=0.005)),
    "s0": ("golden-a", 13, dict(max_new_tokens=48, max_denoising_steps=6, entropy_bound=0.1,
                                 t_min=0.4, t_max=0.8, stability_threshold=0,
                                 confidence_threshold=100.0)),
    "fixed-s1": ("golden-a:fixed", 14, dict(max_new_tokens=32, max_denoising_steps=12,
                                             entropy_bound=1.0, t_min=0.4, t_max=0.8,
                                             stability_threshold=1, confidence_threshold=100.0)),
    "fixed-s2-confident": ("golden-a:fixed", 15, dict(max_new_tokens=16, max_denoising_steps=12,
                                                       entropy_bound=0.5, t_min=0.1, t_max=0.8,
                                                       stability_threshold=2,
                                                       confidence_threshold=0.85)),
    "fixed-unsure": ("golden-a:fixed", 18, dict(max_new_tokens=16, max_denoising_steps=8,
                                                 entropy_bound=2.0, t_min=0.4, t_max=0.8,
                                                 stability_threshold=1,
                                                 confidence_threshold=1.0e-9)),
    "b-default": ("golden-b", 16, dict(max_new_tokens=32, max_denoising_steps=8,
                                        entropy_bound=0.5, t_min=0.4, t_max=0.8,
                                        stability_threshold=1, confidence_threshold=0.005)),
}


class Recorder:
    """Collects what the wrapped HF objects see during one generate call."""

    def __init__(self):
        self.canvases = []   # one dict per canvas
        self.logits = []     # raw decoder logits, one [CL, V] array per step
        self.pending = None  # the step being assembled

    def new_canvas(self, init):
        self.canvases.append(dict(init=init, steps=[]))

    def step(self):
        if self.pending is None:
            self.pending = {}
        return self.pending

    def close_step(self):
        self.canvases[-1]["steps"].append(self.pending)
        self.pending = None


def ints(t):
    return [int(x) for x in t.reshape(-1).tolist()]


def floats(t):
    return [float(x) for x in t.reshape(-1).tolist()]


def instrument(model, rec):
    """Wrap HF's objects on this model instance so every decision is recorded."""
    orig_forward = model.forward

    def forward(*args, **kw):
        out = orig_forward(*args, **kw)
        if kw.get("decoder_input_ids") is not None:
            st = rec.step()
            st["canvas_in"] = ints(kw["decoder_input_ids"][0])
            st["sc"] = kw.get("self_conditioning_logits") is not None
            st["logits_index"] = len(rec.logits)
            st["positions"] = ints(kw["decoder_position_ids"][0])
            rec.logits.append(out.logits[0].detach().float().cpu().numpy().astype(np.float32))
        return out

    model.forward = forward

    orig_prepare_sampler = model._prepare_sampler

    def prepare_sampler(generation_config):
        sampler = orig_prepare_sampler(generation_config)
        orig_init, orig_accept = sampler.initialize_canvas, sampler.accept_canvas
        orig_renoise = sampler.renoise_canvas
        state = dict(in_renoise=False)

        def initialize_canvas(batch_size, device):
            c = orig_init(batch_size, device)
            if state["in_renoise"]:
                rec.step()["renoise"] = ints(c[0])
            else:
                rec.new_canvas(ints(c[0]))
            return c

        def accept_canvas(current_canvas, denoiser_canvas, logits, cur_step):
            out = orig_accept(current_canvas, denoiser_canvas, logits, cur_step)
            st = rec.step()
            st["sample"] = ints(denoiser_canvas[0])
            st["accepted"] = ints(sampler.accepted_token_mask[0].to(torch.int32))
            ent = torch.distributions.Categorical(logits=logits).entropy()[0]
            st["entropy"] = floats(ent)
            # distance of every position's criterion from the bound: replays
            # must not hinge on a rounding-level margin
            srt, _ = torch.sort(ent)
            crit = torch.cumsum(srt, 0) - srt
            st["min_margin"] = float((crit - sampler.entropy_bound).abs().min())
            return out

        def renoise_canvas(accepted_canvas, cur_step):
            state["in_renoise"] = True
            try:
                return orig_renoise(accepted_canvas, cur_step)
            finally:
                state["in_renoise"] = False

        sampler.initialize_canvas = initialize_canvas
        sampler.accept_canvas = accept_canvas
        sampler.renoise_canvas = renoise_canvas
        return sampler

    model._prepare_sampler = prepare_sampler

    orig_prepare_stop = model._prepare_diffusion_stopping_criteria

    def prepare_stop(generation_config):
        crit = orig_prepare_stop(generation_config)
        orig_call = crit.__call__

        class Wrapped:
            def __call__(self, argmax_canvas, logits, **kw):
                s = crit.stability_threshold
                if s == 0:
                    stable = True
                elif crit.argmax_canvas_history is None:
                    stable = False  # history starts at -1, never equal to an id
                else:
                    stable = bool((crit.argmax_canvas_history == argmax_canvas[None]).all())
                res = orig_call(argmax_canvas, logits, **kw)
                ent = torch.distributions.Categorical(logits=logits).entropy()[0]
                st = rec.step()
                st["argmax"] = ints(argmax_canvas[0])
                st["stable"] = stable
                st["mean_entropy"] = float(torch.mean(ent))
                st["confident"] = bool(torch.mean(ent) < crit.confidence_threshold)
                st["finished"] = bool(res[0])
                rec.close_step()
                return res

            def reset(self):
                crit.reset()

            def __getattr__(self, name):
                return getattr(crit, name)

        return Wrapped()

    model._prepare_diffusion_stopping_criteria = prepare_stop

    orig_temp = G.LinearTemperatureScheduleLogitsProcessor.__call__

    def temp_call(self, input_ids, scores, cur_step):
        t = self.t_min + ((self.t_max - self.t_min) * (cur_step / self.max_denoising_steps))
        st = rec.step()
        st["cur_step"] = int(cur_step)
        st["temperature"] = float(torch.as_tensor(t, dtype=torch.float32))
        st["temperature_dtype"] = str(torch.as_tensor(t).dtype)
        return orig_temp(self, input_ids, scores, cur_step)

    G.LinearTemperatureScheduleLogitsProcessor.__call__ = temp_call
    return lambda: setattr(G.LinearTemperatureScheduleLogitsProcessor, "__call__", orig_temp)


def load_model(golden_dir, spec):
    """spec "NAME" or "NAME:fixed": the golden checkpoint; "fixed" unties the LM
    head from the embedding and sets every embedding row to the mean row, so the
    decoder's input no longer depends on the canvas: the argmax canvas repeats
    from the second step on, which is how the stability stop gets exercised on
    a random model (whose argmax otherwise changes at every step)."""
    name, _, variant = spec.partition(":")
    ck = os.path.join(golden_dir, name, "checkpoint")
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(ck, dtype=torch.float32).eval()
    if variant == "fixed":
        with torch.no_grad():
            head = torch.nn.Parameter(model.lm_head.weight.detach().clone())
            model.lm_head.weight = head
            for pname, p in model.named_parameters():
                if pname.endswith("embed_tokens.weight"):
                    p.copy_(p.mean(dim=0, keepdim=True).expand_as(p))
            assert not torch.equal(model.lm_head.weight, model.model.decoder.embed_tokens.weight)
    elif variant:
        raise ValueError(f"unknown model variant {variant}")
    with open(os.path.join(golden_dir, name, "prompt.ids")) as f:
        prompt = [int(x) for x in f.read().split()]
    return model, prompt


def run_case(golden_dir, name, model_name, seed, settings, outdir, eos=None):
    model, prompt = load_model(golden_dir, model_name)
    rec = Recorder()
    undo = instrument(model, rec)
    gen_kw = dict(settings)
    beta = gen_kw.pop("entropy_bound")
    if eos is None:
        eos = list(model.generation_config.eos_token_id or [1])
    torch.manual_seed(seed)
    try:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), disable_compile=True,
                                 sampler_config=G.EntropyBoundSamplerConfig(entropy_bound=beta),
                                 eos_token_id=eos, pad_token_id=0, **gen_kw)
    finally:
        undo()
    seq = ints(out.sequences[0])
    CL = model.config.canvas_length
    for b, c in enumerate(rec.canvases):
        c["emitted"] = c["steps"][-1]["argmax"]
        c["returned"] = seq[len(prompt) + b * CL: len(prompt) + (b + 1) * CL]
    doc = dict(case=name, model=model_name, transformers=transformers.__version__,
               torch=torch.__version__, device="cpu", dtype="float32", torch_seed=seed,
               settings=dict(settings), eos_token_id=eos, pad_token_id=0, prompt=prompt,
               canvas_length=CL, vocab_size=model.config.text_config.vocab_size,
               canvases=rec.canvases, sequences=seq,
               logits=f"{name}-logits.npy")
    np.save(os.path.join(outdir, f"{name}-logits.npy"), np.stack(rec.logits).astype(np.float32))
    with open(os.path.join(outdir, f"{name}.json"), "w") as f:
        json.dump(doc, f, indent=None, separators=(",", ":"))
        f.write("\n")
    steps = [len(c["steps"]) for c in rec.canvases]
    margin = min(s["min_margin"] for c in rec.canvases for s in c["steps"])
    acc = [sum(s["accepted"]) for c in rec.canvases for s in c["steps"]]
    fin = ["".join("S" if s["stable"] else "." for s in c["steps"]) + "/" +
           "".join("C" if s["confident"] else "." for s in c["steps"]) for c in rec.canvases]
    print(f"{name}: {model_name} steps/canvas {steps} stable/confident {fin} accepted/step {acc} "
          f"min margin {margin:.3g} T0 {rec.canvases[0]['steps'][0]['temperature']!r} "
          f"({rec.canvases[0]['steps'][0]['temperature_dtype']})")
    return doc


def main():
    if len(sys.argv) != 3:
        print(__doc__.splitlines()[-2].strip(), file=sys.stderr)
        sys.exit(2)
    golden_dir, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    torch.set_num_threads(4)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for name, (model_name, seed, settings) in CASES.items():
        doc = run_case(golden_dir, name, model_name, seed, settings, outdir)
        if name == "s0":
            # the same run again with an id from the middle of the first
            # emitted canvas as EOS: HF stops there and pads the rest
            eos_id = doc["canvases"][0]["emitted"][5]
            run_case(golden_dir, "eos", model_name, seed, settings, outdir, eos=[eos_id])


if __name__ == "__main__":
    main()
