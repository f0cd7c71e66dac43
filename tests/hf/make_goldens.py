#!/usr/bin/env python3
"""Write the golden fixtures dgemma's CPU backend is checked against.

Runs Hugging Face transformers' DiffusionGemma (the executable reference,
transformers 5.17.0 on the GPU machine) in float32 on the CPU, on small random
models that exercise every feature, and writes for each model:

  checkpoint/            config.json, generation_config.json, model.safetensors
                         (save_pretrained, float32, with a tiny vision tower)
  prompt.ids             the prompt (whitespace-separated token ids)
  canvas1.ids            a canvas for the first decoder step
  canvas2.ids            a canvas for the second decoder step
  commit.ids             the canvas committed after block 1 (encoder pass)
  canvas3.ids            a canvas for the first step of block 2
  encoder_hidden.npy     [P, H]  final-normed encoder hidden states of the prompt
  logits1.npy            [CL, V] decoder step 1: canvas1, no self-conditioning
  sc2.npy                [CL, V] processed logits fed to step 2 = logits1 / 0.8
  logits2.npy            [CL, V] decoder step 2: canvas2, self-conditioned on sc2
  sc3.npy                [CL, V] processed logits fed to block 2's step = logits2 / 0.7
  logits3.npy            [CL, V] block 2: after committing commit.ids at
                         positions P..P+CL-1, canvas3 at P+CL.., self-conditioned on sc3
  meta.json              shapes, seeds, versions

This is the ladder of ../shared/spec/model.md §9b steps 1-3 and 5.  The calls
mirror DiffusionGemmaGenerationMixin.generate: the encoder (prefill, commit)
is model.model.encoder with a DynamicCache; a decoder step is model(...)
with decoder_input_ids, the cache and explicit decoder_position_ids.

usage: python3 tests/hf/make_goldens.py OUTDIR
"""

import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import DynamicCache, Gemma4VisionConfig
from transformers.models.diffusion_gemma import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

# Each model covers a different corner; together: vocab not a multiple of 8,
# sliding window shorter than the prompt, several full layers (K = V, proportional
# RoPE), top_k >= 2, several query heads per KV head, canvas lengths 16 and 32.
MODELS = {
    "golden-a": dict(
        text=dict(vocab_size=301, hidden_size=64, intermediate_size=96, num_hidden_layers=6,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
                  num_global_key_value_heads=1, sliding_window=8, num_experts=8, top_k_experts=2,
                  moe_intermediate_size=32,
                  layer_types=["sliding_attention", "sliding_attention", "full_attention",
                               "sliding_attention", "sliding_attention", "full_attention"]),
        canvas_length=16, prompt_len=21, seed=1001),
    "golden-b": dict(
        text=dict(vocab_size=263, hidden_size=48, intermediate_size=80, num_hidden_layers=4,
                  num_attention_heads=6, num_key_value_heads=3, head_dim=8, global_head_dim=16,
                  num_global_key_value_heads=2, sliding_window=12, num_experts=6, top_k_experts=3,
                  moe_intermediate_size=24,
                  layer_types=["sliding_attention", "full_attention", "sliding_attention",
                               "full_attention"]),
        canvas_length=32, prompt_len=40, seed=2002),
}


def randomize(model, gen):
    """Give every parameter and buffer a distinctive value (HF's init leaves
    norms and scalars at 1, which would hide a swapped or skipped norm)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("router.scale") or \
               name.endswith("per_expert_scale"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
            elif name.endswith("router.proj.weight"):
                p.copy_(2.0 * torch.randn(p.shape, generator=gen))
            elif p.dim() >= 2:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in ** 0.5)
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):  # encoder and decoder copies get different values
                b.copy_(0.5 + torch.rand(b.shape, generator=gen))


def write_ids(path, ids):
    with open(path, "w") as f:
        f.write(" ".join(str(int(i)) for i in ids) + "\n")


def save_npy(path, t):
    np.save(path, t.detach().to(torch.float32).cpu().numpy().astype(np.float32))


def make(name, spec, outdir):
    out = os.path.join(outdir, name)
    os.makedirs(out, exist_ok=True)
    gen = torch.Generator().manual_seed(spec["seed"])
    torch.manual_seed(spec["seed"])

    vision = Gemma4VisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                num_attention_heads=1, num_key_value_heads=1, head_dim=8,
                                position_embedding_size=8, patch_size=4)
    cfg = DiffusionGemmaConfig(text_config=spec["text"], vision_config=vision.to_dict(),
                               canvas_length=spec["canvas_length"])
    model = DiffusionGemmaForBlockDiffusion(cfg).float().eval()
    randomize(model, gen)
    model.save_pretrained(os.path.join(out, "checkpoint"))

    V = spec["text"]["vocab_size"]
    CL = spec["canvas_length"]
    P = spec["prompt_len"]
    rand_ids = lambda n: torch.randint(0, V, (n,), generator=gen)
    prompt, canvas1, canvas2, commit, canvas3 = (rand_ids(P), rand_ids(CL), rand_ids(CL),
                                                rand_ids(CL), rand_ids(CL))

    with torch.no_grad():
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        enc = model.model.encoder(input_ids=prompt[None], past_key_values=cache,
                                  position_ids=torch.arange(P)[None])
        hidden = enc.last_hidden_state[0]
        pos1 = torch.arange(P, P + CL)[None]
        logits1 = model(decoder_input_ids=canvas1[None], past_key_values=cache,
                        decoder_position_ids=pos1).logits[0]
        sc2 = logits1 / 0.8
        logits2 = model(decoder_input_ids=canvas2[None], past_key_values=cache,
                        decoder_position_ids=pos1, self_conditioning_logits=sc2[None]).logits[0]
        sc3 = logits2 / 0.7
        model.model.encoder(input_ids=commit[None], past_key_values=cache,
                            position_ids=torch.arange(P, P + CL)[None])
        logits3 = model(decoder_input_ids=canvas3[None], past_key_values=cache,
                        decoder_position_ids=torch.arange(P + CL, P + 2 * CL)[None],
                        self_conditioning_logits=sc3[None]).logits[0]

    for fname, ids in [("prompt", prompt), ("canvas1", canvas1), ("canvas2", canvas2),
                       ("commit", commit), ("canvas3", canvas3)]:
        write_ids(os.path.join(out, fname + ".ids"), ids)
    for fname, t in [("encoder_hidden", hidden), ("logits1", logits1), ("sc2", sc2),
                     ("logits2", logits2), ("sc3", sc3), ("logits3", logits3)]:
        save_npy(os.path.join(out, fname + ".npy"), t)

    meta = dict(model=name, transformers=transformers.__version__, torch=torch.__version__,
                device="cpu", dtype="float32", seed=spec["seed"], prompt_len=P, canvas_length=CL,
                vocab_size=V, hidden_size=spec["text"]["hidden_size"],
                sliding_window=spec["text"]["sliding_window"],
                attn_implementation=model.config._attn_implementation,
                steps={"logits1": "decoder(canvas1), no SC, positions P..P+CL-1",
                       "logits2": "decoder(canvas2), SC = sc2 = logits1/0.8",
                       "logits3": "commit(commit.ids at P..P+CL-1), then decoder(canvas3) at "
                                  "P+CL..P+2CL-1 with SC = sc3 = logits2/0.7"})
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{name}: P={P} CL={CL} V={V} hidden {tuple(hidden.shape)} "
          f"logits |max| {logits1.abs().max():.3f} {logits2.abs().max():.3f} "
          f"{logits3.abs().max():.3f}; enc/dec layer_scalar[0] "
          f"{float(model.model.encoder.language_model.layers[0].layer_scalar):.4f}/"
          f"{float(model.model.decoder.layers[0].layer_scalar):.4f}")


def main():
    if len(sys.argv) != 2:
        print(__doc__.splitlines()[-1].strip(), file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(4)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    for name, spec in MODELS.items():
        make(name, spec, sys.argv[1])


if __name__ == "__main__":
    main()
