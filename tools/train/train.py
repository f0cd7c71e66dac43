#!/usr/bin/env python3
"""Train the small DiffusionGemma that dgemma ships as its default model.

Runs on the GPU machine (PyTorch and transformers 5.17.0's DiffusionGemma
classes).  The task and the tokenizer are tools/task/task.py's.

The recipe (DiffusionGemma's published one, at toy scale):
  - a problem is [<bos>] prompt, then its answer, <eos>, and <pad> up to a
    whole number of canvases of CANVAS;
  - one response block b of the answer is drawn; the encoder reads the
    clean context (prompt and answer blocks before b) causally, writing the
    KV cache the decoder reads, as generation does;
  - the block is corrupted with uniform noise: each position is replaced by
    a uniformly drawn id with probability t, t ~ U(0.001, 1) per example
    (there is no mask token);
  - loss = cross-entropy over every position of the block (flat) + the
    encoder's causal-LM cross-entropy on the whole clean sequence (prompt
    and every answer block; the decoder still reads only the context's KV);
  - self-conditioning in two passes for half of the examples: a first
    decoder pass without it (no gradient) gives logits, which, divided by a
    temperature T ~ U(0.4, 0.8) as generation divides them, condition the
    second pass.
A draw is problems of one kind and size.  With the lean forward
(tools/train/lean.py, checked against transformers' at start) a step's
batch holds several draws laid out in one fixed shape (tools/train/fixed.py,
checked against unpadded batches at start) and runs as one CUDA graph;
otherwise (--engine hf, --fixed 0) a batch is one draw, unpadded.

Initialisation: Hugging Face's (embedding std 0.02) leaves the scaled
embedding at RMS 0.02*sqrt(hidden) = 0.23 for hidden 128, against the
unit-RMS output every normed sub-layer adds to the residual; the default
here is std hidden^-1/2 (unit RMS, as the 26B-A4B's 0.02*sqrt(2816) is),
and q_norm/k_norm weights head_dim^-1/4 (attention logits of standard
deviation 1 at init, the query scaling being 1.0).  docs/notes.md
("Training the default model") has what each choice did.  Prompts reserved for evaluation (task.py's
hash) are never trained on.

usage:
  train.py train --out DIR --minutes M [--batch B] [--lr LR] [--seed S] [--log CSV]
                 [--qk-norm-init X] [--embed-std X] [--print-every N] [--experts IMPL]
                 [--warmup N] [--init DIR-state.pt|MODEL_DIR | --resume DIR-resume.pt]
                 [--schedule-minutes T] [--engine lean|hf]
                 [--compile 0|1] [--profile N] [--hidden H] [--fixed 0|1] [--parts N]
                 [--graph 0|1] [--amp 0|1] [--kind-odds KIND=X,...] [--prep-steps K]
    (writes the model to DIR, its fp32 weights to DIR-state.pt, which
    --init starts from, and to DIR-resume.pt those with the optimizer's
    state, the step count and the schedule's minutes trained, which
    --resume continues from.  The learning rate's cosine spans T minutes
    (default M, or the resumed run's), so calls of M minutes each, each
    resuming the last, train as one run of T; a call trains M minutes
    whatever is left of T, and draws its batches with seed S + its first
    step)
  train.py eval --model DIR --problems FILE [--limit N] [--out FILE.jsonl]
  train.py plot --log CSV[,CSV...] --png FILE
"""

import argparse
import csv
import inspect
import json
import math
import os
import random
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "task"))
import task  # noqa: E402
from lean import Lean, check  # noqa: E402
import fixed  # noqa: E402

CL = task.CANVAS
V = task.VOCAB

# The model: the "small" preset's shape, wider.  A sliding window of 128
# covers the longest sequence the task makes (57 prompt + 64 answer ids),
# so training (which attends to the whole context) and generation agree.
TEXT_CONFIG = dict(
    vocab_size=V, hidden_size=128, intermediate_size=256, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, global_head_dim=64,
    num_global_key_value_heads=1, sliding_window=128, num_experts=8, top_k_experts=2,
    moe_intermediate_size=64, max_position_embeddings=4096,
    layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
    pad_token_id=task.PAD, eos_token_id=task.EOS, bos_token_id=task.BOS)
GENERATION_CONFIG = {
    "confidence_threshold": 0.005, "eos_token_id": [task.EOS, 6], "max_denoising_steps": 48,
    "max_new_tokens": 64, "pad_token_id": task.PAD,
    "sampler_config": {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 0.001},
    "stability_threshold": 1, "t_max": 0.8, "t_min": 0.4,
}


# the lean forward is used only if it agrees with transformers' to this
# (largest absolute difference of keys, values and decoder logits, fp32)
LEAN_TOLERANCE = 2e-3
# --compile with fixed-shape batches: the compiled step's losses (absolute)
# and gradients (relative) against the eager step's, fp32 and bf16 autocast
# (inductor may keep in fp32 what eager autocast rounds to bf16)
COMPILE_TOLERANCE = {False: 2e-3, True: 3e-2}


_IDS = {}


def ids_of(text, device):
    """text's ids [len] on device, made once per text: a tensor built from a
    host list is a copy from pageable memory, which waits for the stream
    (and so for the step the GPU is running) before it starts."""
    key = (text, str(device))
    if key not in _IDS:
        _IDS[key] = torch.tensor([task.char_id(c) for c in text], dtype=torch.long,
                                 device=device)
    return _IDS[key]


class Sampler:
    """Batches of one kind and size.  Sizes and kinds come from a host RNG
    and the contents from a device generator, so drawing a batch never
    waits for the GPU."""

    def __init__(self, device, gen, seed):
        self.dev, self.g = device, gen
        self.r = random.Random(seed)
        self.a = task.char_id("a")
        self.zero = task.char_id("0")

    def randint(self, lo, hi, shape):
        return torch.randint(lo, hi, shape, device=self.dev, generator=self.g)

    def const(self, text, B):
        return ids_of(text, self.dev).expand(B, -1)

    def digits_number(self, B, nd):
        """[B, nd] digits of numbers with nd digits (no leading zero)."""
        d = self.randint(0, 10, (B, nd))
        if nd > 1:
            d[:, 0] = self.randint(1, 10, (B,))
        return d

    def batch(self, kind, B):
        """(prompt ids [B, P] with <bos>, answer ids [B, A] padded with <pad>, answer lengths [B])."""
        bos = torch.full((B, 1), task.BOS, dtype=torch.long, device=self.dev)
        if kind in ("reverse", "sort"):
            n = self.r.randint(*(task.REVERSE_LEN if kind == "reverse" else task.SORT_LEN))
            if kind == "reverse":
                x = self.randint(0, 26, (B, n)) + self.a
                ans = x.flip(1)
            else:
                x = self.randint(0, 10, (B, n)) + self.zero
                ans = x.sort(dim=1).values
            prompt = torch.cat([bos, self.const(kind + " ", B), x], 1)
            return prompt, ans, torch.full((B,), n, device=self.dev)
        if kind == "add":
            na, nb = self.r.randint(*task.ADD_DIGITS), self.r.randint(*task.ADD_DIGITS)
            da, db = self.digits_number(B, na), self.digits_number(B, nb)
            pw = lambda n: 10 ** torch.arange(n - 1, -1, -1, device=self.dev)  # noqa: E731
            s = (da * pw(na)).sum(1) + (db * pw(nb)).sum(1)
            k = max(na, nb) + 1
            sd = (s[:, None] // pw(k)) % 10                          # [B, k], leading zeros
            lead = torch.clamp((sd.cumsum(1) == 0).sum(1), max=k - 1)  # zeros to drop
            idx = torch.arange(k, device=self.dev)[None, :] + lead[:, None]
            ans = torch.gather(sd, 1, idx.clamp(max=k - 1)) + self.zero
            length = k - lead
            ans = torch.where(idx >= k, task.PAD, ans)   # (a masked store would wait for the GPU)
            prompt = torch.cat([bos, self.const("add ", B), da + self.zero, self.const("+", B),
                                db + self.zero], 1)
            return prompt, ans, length
        if kind == "get":
            n, w = self.r.randint(*task.GET_PAIRS), self.r.randint(*task.GET_WIDTH)
            keys = torch.rand((B, 26), device=self.dev, generator=self.g).argsort(1)[:, :n] + self.a
            vals = self.randint(0, 10, (B, n, w)) + self.zero
            q = self.randint(0, n, (B,))
            parts = [bos, self.const("get ", B), keys.gather(1, q[:, None]), self.const(" ", B)]
            for i in range(n):
                parts += [keys[:, i:i + 1], self.const("=", B), vals[:, i]]
                if i + 1 < n:
                    parts.append(self.const(",", B))
            ans = vals[torch.arange(B, device=self.dev), q]
            return torch.cat(parts, 1), ans, torch.full((B,), w, device=self.dev)
        raise ValueError(kind)


_POWERS = {}


def reserved_rows(prompt):
    """task.reserved over each row of prompt ids, in torch: the hash
    h = (h * 31 + id) mod P over a row is sum_j id_j 31^(T-1-j) mod P
    (each term below 384 * P, the sum far inside int64)."""
    T = prompt.shape[1]
    key = (T, str(prompt.device))
    if key not in _POWERS:   # (made once per length: see ids_of)
        _POWERS[key] = torch.tensor([pow(31, T - 1 - j, task.HASH_P) for j in range(T)],
                                    dtype=torch.long, device=prompt.device)
    return (prompt * _POWERS[key]).sum(1) % task.HASH_P % task.HOLDOUT_MOD == 0


def canvases(ans, length):
    """[B, nblk*CL]: the answer, <eos> at its length, <pad> after."""
    B, A = ans.shape
    nblk = (A + 1 + CL - 1) // CL
    out = torch.full((B, nblk * CL), task.PAD, dtype=torch.long, device=ans.device)
    out[:, :A] = ans
    pos = torch.arange(nblk * CL, device=ans.device)[None, :]
    out = torch.where(pos == length[:, None], task.EOS, out)
    return torch.where(pos > length[:, None], task.PAD, out)


def draw(sampler, kinds, B, odds=None):
    """One training batch: (kind, prompt ids, answer canvases, weight [B]),
    the kind drawn from kinds with the relative odds given (a dict; equal
    without).  A row whose prompt is reserved for evaluation has weight 0:
    it passes through the model but adds nothing to the loss (rows do not
    interact)."""
    kind = sampler.r.choices(kinds, [odds.get(k, 1.0) for k in kinds])[0] if odds else \
        sampler.r.choice(kinds)
    prompt, ans, length = sampler.batch(kind, B)
    weight = (~reserved_rows(prompt)).float()
    return kind, prompt, canvases(ans, length), weight


def kind_odds(text):
    """--kind-odds "add=2,get=1" as {kind: odds}; None for an empty text.
    Raises ValueError for an unknown kind or odds that are not positive."""
    if not text:
        return None
    out = {}
    for item in text.split(","):
        kind, _, val = item.partition("=")
        if kind not in task.TASKS or not val or float(val) <= 0:
            raise ValueError("--kind-odds: %r (kinds %s, odds > 0)" % (item, ", ".join(task.TASKS)))
        out[kind] = float(val)
    return out


def self_check(device):
    """The torch sampler against task.py's plain-Python answers and hash."""
    g = torch.Generator(device=device).manual_seed(7)
    s = Sampler(device, g, 7)
    n = 0
    for kind in task.TASKS:
        for _ in range(40):
            _, prompt, canv, weight = draw(s, [kind], 16)
            for p, c, wt in zip(prompt.tolist(), canv.tolist(), weight.tolist()):
                text = task.decode(p[1:])
                assert p == task.encode(text), (kind, text)
                assert task.reserved(text) == (wt == 0.0), text
                assert task.decode(c) == task.solve(text), (text, task.decode(c))
                eos = c.index(task.EOS)
                assert all(v == task.PAD for v in c[eos + 1:]), c
                n += 1
    return n


def text_config(hidden):
    """TEXT_CONFIG at another width: the widths in the same proportions
    (MLP 2x, heads of hidden/4, full-layer heads and experts hidden/2)."""
    c = dict(TEXT_CONFIG)
    if hidden != c["hidden_size"]:
        assert hidden % 64 == 0, "hidden a multiple of 64 (FP8 and TP shapes)"
        c.update(hidden_size=hidden, intermediate_size=2 * hidden, head_dim=hidden // 4,
                 global_head_dim=hidden // 2, moe_intermediate_size=hidden // 2)
    return c


def make_model(hidden=TEXT_CONFIG["hidden_size"]):
    from transformers import Gemma4VisionConfig
    from transformers.models.diffusion_gemma import (DiffusionGemmaConfig,
                                                     DiffusionGemmaForBlockDiffusion)
    vision = Gemma4VisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                num_attention_heads=1, num_key_value_heads=1, head_dim=8,
                                position_embedding_size=8, patch_size=4)
    cfg = DiffusionGemmaConfig(text_config=text_config(hidden), vision_config=vision.to_dict(),
                               canvas_length=CL)
    cfg.eos_token_id = [task.EOS, 6]
    return DiffusionGemmaForBlockDiffusion(cfg)


def check_tied(model):
    """The encoder's text stack must be the decoder's (and the head the
    embedding): training updates one set of weights."""
    dec = dict(model.model.decoder.named_parameters())
    n = 0
    for name, p in model.model.encoder.language_model.named_parameters():
        if name in dec:
            assert p.data_ptr() == dec[name].data_ptr(), "encoder %s is not tied" % name
            n += 1
    assert model.lm_head.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    return n


def init_scales(model, qk_norm_init, embed_std):
    """Optional initial values: q_norm and k_norm weights (with query
    scaling 1.0 the attention logits of unit-RMS q and k have a standard
    deviation of sqrt(head_dim) at init; head_dim^-1/4 on both brings it to
    1), and the embedding's standard deviation (1/sqrt(hidden) makes the
    scaled embedding unit RMS).  0 keeps Hugging Face's initialisation.
    The embedding's <pad> row is made trainable either way."""
    # the <pad> row trains like any other: it is predicted after every
    # <eos>, and a row held at its initial value pins <pad>'s logit
    model.model.decoder.embed_tokens.padding_idx = None
    model.model.encoder.language_model.embed_tokens.padding_idx = None
    with torch.no_grad():
        for layer in model.model.decoder.layers:
            att = layer.self_attn
            if qk_norm_init:
                v = att.head_dim ** -0.25 if qk_norm_init < 0 else qk_norm_init
                att.q_norm.weight.fill_(v)
                att.k_norm.weight.fill_(v)
        if embed_std:
            w = model.model.decoder.embed_tokens.weight
            w.normal_(0.0, embed_std if embed_std > 0 else w.shape[1] ** -0.5)


def pick_experts(model, impl, dev):
    """transformers' experts backend (eager loops over the experts with a
    host synchronisation each; grouped_mm runs them as one grouped GEMM):
    impl if it is there and a forward and backward run with it, else eager."""
    if impl == "eager":
        return
    try:
        model.set_experts_implementation(impl)
        from transformers import DynamicCache
        ids = torch.randint(0, V, (2, 16), device=dev)
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        enc = model.model.encoder(input_ids=ids, past_key_values=cache,
                                  position_ids=torch.arange(16, device=dev)[None].expand(2, -1))
        z = model(decoder_input_ids=ids, past_key_values=cache,
                  decoder_position_ids=torch.arange(16, 32, device=dev)[None].expand(2, -1)).logits
        (z.float().sum() + enc.last_hidden_state.float().sum()).backward()
        model.zero_grad(set_to_none=True)
        print("experts implementation:", impl, flush=True)
    except Exception as e:  # noqa: BLE001 (any failure means: not this one)
        print("experts implementation %s not usable (%s: %s): eager" %
              (impl, type(e).__name__, str(e)[:200]), flush=True)
        model.zero_grad(set_to_none=True)
        if hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation("eager")


def softcap(model, logits):
    c = model.config.text_config.final_logit_softcapping
    return torch.tanh(logits.float() / c) * c


PROFILE_FROM = 30      # steps before --profile starts recording


def compile_lean(lean):
    """lean.encode and lean.decode through torch.compile (shapes dynamic:
    every batch has its own lengths); a call whose compilation fails runs
    eagerly from then on."""
    for name in ("encode", "decode"):
        eager = getattr(lean, name)
        compiled = torch.compile(eager, dynamic=True)
        state = {"ok": True}

        def call(*a, _c=compiled, _e=eager, _s=state, _n=name, **k):
            if _s["ok"]:
                try:
                    return _c(*a, **k)
                except Exception as e:  # noqa: BLE001 (eager is always right)
                    _s["ok"] = False
                    print("compiled %s failed (%s: %s): eager from now on" %
                          (_n, type(e).__name__, str(e)[:300]), flush=True)
            return _e(*a, **k)
        setattr(lean, name, call)
    print("lean forward compiled (torch.compile, dynamic shapes)", flush=True)


def weighted_ce(logits, target, weight):
    """Cross-entropy averaged over the positions of the rows of weight 1.
    logits [B, L, V], target [B, L], weight [B]."""
    ce = F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), reduction="none")
    ce = ce.view(target.shape).mean(1)
    return (ce * weight).sum() / weight.sum().clamp(min=1.0)


def train(args):
    from transformers import DynamicCache
    import transformers
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    # --resume: what a previous call saved at its end (weights, optimizer
    # state, step count, schedule); a continuation seeds its generators with
    # its first step added, so it does not draw the first call's batches again
    resume = torch.load(args.resume, map_location=dev) if args.resume else None
    step0 = resume["step"] if resume else 0
    seed = args.seed + step0
    torch.manual_seed(seed)
    print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)
    print("sampler self-check:", self_check(dev), "problems agree with task.py", flush=True)

    model = make_model(args.hidden).to(dev).train()
    n_tied = check_tied(model)
    init_scales(model, args.qk_norm_init, args.embed_std)
    if args.init:
        if os.path.isdir(args.init):
            # a saved model (bf16, as shipped in model/default): its weights in fp32
            from transformers.models.diffusion_gemma import DiffusionGemmaForBlockDiffusion
            src = DiffusionGemmaForBlockDiffusion.from_pretrained(args.init).float()
            state = src.state_dict()
            del src
        else:
            state = torch.load(args.init, map_location=dev)
        model.load_state_dict(state)
        print("weights from", args.init, flush=True)
    elif resume:
        model.load_state_dict(resume["model"])
        print("weights from", args.resume, flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    print("parameters %d (%d encoder tensors tied to the decoder's)" % (n_params, n_tied), flush=True)
    pick_experts(model, args.experts, dev)
    sig = inspect.signature(model.forward).parameters
    per_example_sc = "self_conditioning_mask" in sig
    print("per-example self-conditioning mask:", per_example_sc, flush=True)
    lean = None
    if args.engine == "lean":
        lean = Lean(model)
        if not per_example_sc:
            print("lean forward not checked (no per-example self-conditioning): transformers'",
                  flush=True)
            lean = None
        else:
            try:
                worst, diffs = check(model, lean, V, dev)
            except Exception as e:  # noqa: BLE001 (any failure: not trusted)
                worst, diffs = math.inf, {"error %s: %s" % (type(e).__name__, str(e)[:300]): math.inf}
            print("lean forward against transformers' (max abs difference):",
                  ", ".join("%s %.2e" % kv for kv in diffs.items()), flush=True)
            gated = max(v for k, v in diffs.items() if k != "encoder logits")
            if not gated <= LEAN_TOLERANCE:
                print("lean forward disagrees (%.3g > %g): transformers' forward instead" %
                      (gated, LEAN_TOLERANCE), flush=True)
                lean = None
    print("forward:", "lean" if lean else "transformers", flush=True)
    if lean is not None and args.compile and not args.fixed:
        compile_lean(lean)

    g = torch.Generator(device=dev).manual_seed(seed)
    s = Sampler(dev, g, seed)
    odds = kind_odds(args.kind_odds)
    if odds:
        print("kinds drawn with odds", odds, flush=True)
    B = args.batch
    use_fixed = lean is not None and args.fixed
    if use_fixed:
        assert B % args.parts == 0, "--batch a multiple of --parts"
        b_part = B // args.parts

        def draw_parts(n, rows):
            out = []
            for _ in range(n):
                kind, prompt, canv, weight = draw(s, task.TASKS, rows, odds)
                out.append((task.TASKS.index(kind), prompt, canv, weight))
            return out

        def next_batches():
            """--prep-steps K steps' batches made at once: --parts draws of
            K times the rows, assembled, the rows shuffled and cut into K
            batches (views).  Each step still mixes the kinds of its parts'
            draws; the host's few hundred small operations a batch (run 56:
            50-110 ms a step, as long as the GPU's step) are paid once for K
            steps."""
            K = args.prep_steps
            big = fixed.assemble(draw_parts(args.parts, b_part * K), CL, V, g, dev)
            big = big.take(torch.randperm(B * K, device=dev, generator=g))
            return [big.rows(i * B, (i + 1) * B) for i in range(K)]
        pending = []

        # padded against unpadded: a two-canvas reversal, a lookup, a sum and
        # a sort, 4 rows each
        probe = []
        for kind, blocks in (("reverse", 2), ("get", 1), ("add", 1), ("sort", 0)):
            for _ in range(200):
                _, prompt, canv, weight = draw(s, [kind], 4)
                if not blocks or canv.shape[1] == blocks * CL:
                    break
            probe.append((task.TASKS.index(kind), prompt, canv, weight))
        try:
            worst, diffs = fixed.check(lean, probe, CL, V, dev)
        except Exception as e:  # noqa: BLE001 (any failure: not trusted)
            worst, diffs = math.inf, {"error %s: %s" % (type(e).__name__, str(e)[:300]): math.inf}
        print("fixed-shape batches against unpadded (max abs difference):",
              ", ".join("%s %.2e" % kv for kv in diffs.items()), flush=True)
        if not worst <= LEAN_TOLERANCE:
            print("fixed-shape batches disagree: batches of one shape each instead", flush=True)
            use_fixed = False
    loss_fn = fixed.losses
    if use_fixed and args.compile:
        t_c = time.time()
        fn, diffs = fixed.compile_losses(lean, [p for p in model.parameters() if p.requires_grad],
                                         fixed.assemble(draw_parts(args.parts, b_part), CL, V, g,
                                                        dev), V, args.amp,
                                         COMPILE_TOLERANCE[bool(args.amp)])
        print("compiled step against eager (%.0f s to compile and check):" % (time.time() - t_c),
              ", ".join("%s %.2e" % kv for kv in diffs.items()),
              "" if fn else "- eager steps instead", flush=True)
        loss_fn = fn or loss_fn
    if use_fixed:
        opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(args.lr, device=dev),
                                betas=(0.9, 0.98), weight_decay=0.01, capturable=True)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98),
                                weight_decay=0.01, fused=True)
    if resume:   # (before the capture below: the graph reads the state's tensors)
        load_opt_state(opt, resume["opt"])
        print("optimizer state from", args.resume, flush=True)
    if use_fixed:
        lr_t = opt.param_groups[0]["lr"]   # (the tensor the optimizer, and its graph, read)
        gstep = None
        amp = bool(args.amp)
        # the capture's warm-up steps (at learning rate 0) still move the
        # moments and step counts: a resumed state is put back as loaded
        # after it, in place (the graph reads these tensors)
        loaded = [(t, t.clone()) for st in opt.state.values() for t in st.values()]
        # each precision with the compiled losses, then the eager ones: an
        # eager step outside a graph is several times slower than either
        fns = [loss_fn] if loss_fn is fixed.losses else [loss_fn, fixed.losses]
        for try_amp, fn in [(a, f) for a in ([True, False] if amp else [False]) for f in fns] \
                if args.graph else []:
            try:
                gstep = fixed.GraphStep(model, lean, opt, fixed.assemble(
                    draw_parts(args.parts, b_part), CL, V, g, dev), V, 1.0, try_amp, fn)
                amp, loss_fn = try_amp, fn
                break
            except Exception as e:  # noqa: BLE001 (eager steps are always right)
                print("CUDA graph capture%s%s failed (%s: %s)" % (
                      " with bf16 autocast" if try_amp else "",
                      ", compiled" if fn is not fixed.losses else "",
                      type(e).__name__, str(e)[:300]), flush=True)
                opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for t, kept in loaded:
                t.copy_(kept)
        print("fixed-shape batches of %d parts of %d, %s%s, %s" %
              (args.parts, b_part, "one CUDA graph a step" if gstep else "eager",
               ", compiled" if loss_fn is not fixed.losses else "",
               "bf16 autocast" if amp else "fp32 (TF32 products)"), flush=True)
    budget = args.minutes * 60.0
    # the schedule over all calls: its length, and the minutes earlier calls trained
    sched = args.schedule_minutes or (resume["schedule_minutes"] if resume else args.minutes)
    m0 = resume["minutes"] if resume else 0.0
    print("learning-rate schedule: %g minutes, from minute %.2f and step %d (seed %d)" %
          (sched, m0, step0, seed), flush=True)
    log = open(args.log, "w", newline="")
    w = csv.writer(log)
    w.writerow(["step", "seconds", "lr", "loss", "canvas_loss", "encoder_loss", "canvas_acc"])
    t0 = time.time()
    step = step0      # the run's step count, over all calls (warm-up, log and lines)
    zero = lambda: torch.zeros((), device=dev)  # noqa: E731
    run = [zero(), zero(), zero(), 0]         # summed on the device: no wait per step
    # (fixed-shape path) the host's time preparing batches, and the GPU's
    # for the last step (events around it), printed with each line
    timing = {"host": 0.0, "steps": 0,
              "ev": [torch.cuda.Event(enable_timing=True) for _ in range(2)]}
    # per kind: the canvas accuracy over all positions (most of a short
    # answer's canvas is <eos> and <pad>), and the share of rows whose whole
    # canvas is right (what a lookup not yet learned shows)
    acc_ema = {k: zero() for k in task.TASKS}
    exact_ema = {k: zero() for k in task.TASKS}

    prof_state = {}

    def profile_tick(step):
        """With --profile N: record steps PROFILE_FROM .. + N of this call
        (called after each step, either path, with this call's count) and
        print the heaviest operations."""
        if args.profile and step == PROFILE_FROM:
            prof_state["p"] = torch.profiler.profile(activities=[
                torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
            prof_state["p"].__enter__()
            prof_state["t"] = time.time()
        if args.profile and step == PROFILE_FROM + args.profile and "p" in prof_state:
            torch.cuda.synchronize()
            prof_state["p"].__exit__(None, None, None)
            print("profile: %d steps in %.1f ms each (wall)" %
                  (args.profile, (time.time() - prof_state["t"]) * 1e3 / args.profile), flush=True)
            for key in ("self_cuda_time_total", "self_cpu_time_total"):
                print(prof_state["p"].key_averages().table(sort_by=key, row_limit=18), flush=True)

    def log_step(step, lr, acc):
        """Every 50 steps a CSV row (the means since the last), every
        print_every a line; the only waits for the GPU."""
        if step % 50:
            return
        n = run[3]
        tot, cv, en = (float(x) / n for x in run[:3])
        w.writerow([step, "%.1f" % (time.time() - t0), "%.3g" % lr, "%.4f" % tot,
                    "%.4f" % cv, "%.4f" % en, "%.4f" % float(acc)])
        log.flush()
        if step % args.print_every == 0:
            print("step %d %.0fs lr %.2e loss %.4f (canvas %.4f, encoder %.4f) acc %s; "
                  "rows exact %s" %
                  (step, time.time() - t0, lr, tot, cv, en,
                   " ".join("%s %.3f" % (k, float(v)) for k, v in sorted(acc_ema.items())),
                   " ".join("%s %.3f" % (k, float(v)) for k, v in sorted(exact_ema.items()))),
                  flush=True)
            if timing["steps"]:
                timing["ev"][1].synchronize()
                print("  a step: batch preparation on the host %.1f ms, the GPU's step %.1f ms" %
                      (timing["host"] * 1e3 / timing["steps"],
                       timing["ev"][0].elapsed_time(timing["ev"][1])), flush=True)
                timing["host"], timing["steps"] = 0.0, 0
        run[:] = [zero(), zero(), zero(), 0]
    while True:
        el = time.time() - t0
        if el >= budget:
            break
        # where the schedule stands: past its end (a longer run than it) the
        # learning rate stays at its floor
        frac = min(1.0, (m0 + el / 60.0) / sched)
        lr = args.lr * min(1.0, (step + 1) / args.warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))
        if use_fixed:
            t_host = time.perf_counter()
            lr_t.fill_(lr)
            if not pending:
                pending = next_batches()
            S = pending.pop(0)
            timing["host"] += time.perf_counter() - t_host
            timing["steps"] += 1
            timing["ev"][0].record()
            if gstep:
                gstep.S.copy_(S)
                canvas_loss, enc_loss, acc_rows = gstep.step()
            else:
                opt.zero_grad(set_to_none=True)
                with fixed.autocast(amp):
                    canvas_loss, enc_loss, acc_rows = loss_fn(lean, S, V)
                (canvas_loss + enc_loss).backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
            timing["ev"][1].record()
            with torch.no_grad():
                run[0] += canvas_loss + enc_loss
                run[1] += canvas_loss
                run[2] += enc_loss
                acc = acc_rows.mean()
                exact_rows = (acc_rows == 1.0).float()
                for k, name in enumerate(task.TASKS):
                    m = (S.kind == k).float()
                    cnt = m.sum()
                    for ema, rows in ((acc_ema, acc_rows), (exact_ema, exact_rows)):
                        val = (rows * m).sum() / cnt.clamp(min=1.0)
                        ema[name].copy_(torch.where(cnt > 0, 0.9 * ema[name] + 0.1 * val,
                                                    ema[name]))
            run[3] += 1
            profile_tick(step - step0)
            step += 1
            log_step(step, lr, acc)
            continue
        for grp in opt.param_groups:
            grp["lr"] = lr

        kind, prompt, canv, weight = draw(s, task.TASKS, B, odds)
        nblk = canv.shape[1] // CL
        b = s.r.randrange(nblk)
        target = canv[:, b * CL:(b + 1) * CL]
        t = 0.001 + 0.999 * torch.rand((B, 1), device=dev, generator=g)
        noisy = torch.where(torch.rand((B, CL), device=dev, generator=g) < t,
                            s.randint(0, V, (B, CL)), target)
        P = prompt.shape[1] + b * CL
        pos = torch.arange(P, P + CL, device=dev)[None].expand(B, -1)

        # the encoder reads the whole clean sequence (its causal-LM loss covers
        # the answer too); the decoder reads only the context's KV, as in
        # generation, where block b sees the prompt and blocks before it
        full = torch.cat([prompt, canv], 1)
        assert full.shape[1] < TEXT_CONFIG["sliding_window"], "the sliding cache would drop keys"
        if per_example_sc:
            use_sc = torch.rand((B,), device=dev, generator=g) < 0.5
        else:
            use_sc = s.r.random() < 0.5
        temp = 0.4 + 0.4 * torch.rand((B, 1, 1), device=dev, generator=g)
        if lean is not None:
            x, kv = lean.encode(full)
            enc_loss = weighted_ce(lean.logits(x[:, :-1]), full[:, 1:], weight)
            ctx_kv = [(k[:, :, :P], v[:, :, :P]) for k, v in kv]
            with torch.no_grad():
                z1 = lean.decode(noisy, ctx_kv, P)
            z = lean.decode(noisy, ctx_kv, P, z1 / temp, use_sc)
        else:
            full_cache = DynamicCache(config=model.config.get_text_config(decoder=True))
            enc = model.model.encoder(input_ids=full, past_key_values=full_cache,
                                      position_ids=torch.arange(full.shape[1], device=dev)[None].expand(B, -1))
            cache = DynamicCache(config=model.config.get_text_config(decoder=True))
            for li, layer in enumerate(full_cache.layers):
                cache.update(layer.keys[:, :, :P], layer.values[:, :, :P], li)
            enc_logits = softcap(model, model.lm_head(enc.last_hidden_state[:, :-1]))
            enc_loss = weighted_ce(enc_logits, full[:, 1:], weight)
            kw = {}
            if per_example_sc or use_sc:
                with torch.no_grad():
                    z1 = model(decoder_input_ids=noisy, past_key_values=cache,
                               decoder_position_ids=pos).logits
                kw["self_conditioning_logits"] = z1 / temp
                if per_example_sc:
                    kw["self_conditioning_mask"] = use_sc
            z = model(decoder_input_ids=noisy, past_key_values=cache, decoder_position_ids=pos,
                      **kw).logits
        canvas_loss = weighted_ce(z, target, weight)
        loss = canvas_loss + enc_loss

        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        profile_tick(step - step0)

        with torch.no_grad():
            right = (z.argmax(-1) == target).float()
            acc = right.mean()
            run[0] += loss.detach()
            run[1] += canvas_loss.detach()
            run[2] += enc_loss.detach()
            acc_ema[kind].mul_(0.9).add_(0.1 * acc)
            exact_ema[kind].mul_(0.9).add_(0.1 * (right.amin(-1) == 1.0).float().mean())
        run[3] += 1
        step += 1
        log_step(step, lr, acc)
    torch.cuda.synchronize()
    log.close()
    print("trained %d steps of %d in %.0f s (%d in all)" %
          (step - step0, B, time.time() - t0, step), flush=True)
    torch.save(model.state_dict(), args.out.rstrip("/") + "-state.pt")
    # what --resume continues from (before save, which turns the model to bf16)
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step,
                "minutes": m0 + el / 60.0, "schedule_minutes": sched, "seed": args.seed},
               args.out.rstrip("/") + "-resume.pt")
    save(model, args.out)


def load_opt_state(opt, state):
    """A saved AdamW state (moments and step counts) into opt, which keeps
    its own settings: its learning rate (on the fixed-shape path the device
    tensor its graph reads) and capturable or fused, which a state saved on
    the other path would change.  Either wants the step counts as fp32
    tensors on the parameters' device."""
    own = [{k: v for k, v in grp.items() if k != "params"} for grp in opt.param_groups]
    opt.load_state_dict(state)
    for grp, kept in zip(opt.param_groups, own):
        grp.update(kept)
    for p, st in opt.state.items():
        for k, v in list(st.items()):
            st[k] = v.to(device=p.device, dtype=torch.float32 if k == "step" else v.dtype)


def save(model, out):
    model = model.eval().to(torch.bfloat16)
    model.save_pretrained(out)
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump(GENERATION_CONFIG, f, indent=2, sort_keys=True)
        f.write("\n")
    task.write_tokenizer(out)
    print("saved", out, sorted(os.listdir(out)), flush=True)


def evaluate(args):
    """Hugging Face's generate over the problems: exact match per task."""
    from transformers.models.diffusion_gemma import DiffusionGemmaForBlockDiffusion
    import transformers.models.diffusion_gemma as G
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(args.model).float().to(dev).eval()
    probs = [json.loads(x) for x in open(args.problems)][:args.limit or None]
    groups = {}
    for p in probs:
        groups.setdefault(len(task.encode(p["prompt"])), []).append(p)
    gc = GENERATION_CONFIG
    torch.manual_seed(args.seed)
    results, t0 = {}, time.time()
    for plen, ps in sorted(groups.items()):
        x = torch.tensor([task.encode(p["prompt"]) for p in ps], device=dev)
        with torch.no_grad():
            out = model.generate(
                x, disable_compile=True, max_new_tokens=gc["max_new_tokens"],
                max_denoising_steps=gc["max_denoising_steps"], t_max=gc["t_max"], t_min=gc["t_min"],
                stability_threshold=gc["stability_threshold"],
                confidence_threshold=gc["confidence_threshold"],
                sampler_config=G.EntropyBoundSamplerConfig(
                    entropy_bound=gc["sampler_config"]["entropy_bound"]),
                eos_token_id=gc["eos_token_id"], pad_token_id=gc["pad_token_id"])
        seqs = out.sequences if hasattr(out, "sequences") else out
        for p, row in zip(ps, seqs.tolist()):
            results[p["id"]] = task.decode(row[plen:])
    per, lines = {}, []
    for p in probs:
        ok = results[p["id"]] == p["answer"]
        c = per.setdefault(p["task"], [0, 0])
        c[0] += ok
        c[1] += 1
        lines.append(json.dumps({"id": p["id"], "text": results[p["id"]], "ok": ok}))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    total = sum(c[0] for c in per.values())
    for k, (ok, n) in sorted(per.items()):
        print("%-8s %d/%d" % (k, ok, n))
    print("hf-generate exact match %d/%d = %.4f (%.0f s)" %
          (total, len(probs), total / max(1, len(probs)), time.time() - t0), flush=True)


def joined_logs(paths):
    """The rows of several logs, in order, and each row's step over all of
    them: a log whose steps start again (a call that began from the last
    one's weights with --init) continues from the last step before it; a
    resumed call's steps already do.  Also the steps where such a log
    begins."""
    rows, steps, starts, last = [], [], [], 0
    for path in paths:
        part = list(csv.DictReader(open(path)))
        offset = last if part and int(part[0]["step"]) <= last else 0
        if offset:
            starts.append(offset)
        for r in part:
            rows.append(r)
            steps.append(int(r["step"]) + offset)
        if steps:
            last = steps[-1]
    return rows, steps, starts


def plot(args):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    # (several logs, comma-separated: the calls of one run)
    rows, step, starts = joined_logs(args.log.split(","))
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in (("canvas_loss", "canvas cross-entropy"),
                       ("encoder_loss", "encoder causal-LM cross-entropy")):
        ax.plot(step, [float(r[key]) for r in rows], label=label)
    for x in starts:
        ax.axvline(x, color="gray", linestyle="--", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title("Training the default model (tools/train/train.py)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.png, dpi=100)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["train", "eval", "plot"])
    ap.add_argument("--out")
    ap.add_argument("--minutes", type=float, default=7.0)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--log", default="train-log.csv")
    ap.add_argument("--model")
    ap.add_argument("--problems")
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--png")
    ap.add_argument("--qk-norm-init", type=float, default=-1.0,
                    help="initial q_norm/k_norm weight (-1: head_dim^-1/4; 0: HF's)")
    ap.add_argument("--embed-std", type=float, default=-1.0,
                    help="initial embedding std (-1: hidden^-1/2; 0: HF's)")
    ap.add_argument("--print-every", type=int, default=500)
    ap.add_argument("--engine", choices=["lean", "hf"], default="lean",
                    help="the training forward: lean (tools/train/lean.py, checked against "
                         "transformers' first) or transformers' own")
    ap.add_argument("--compile", type=int, default=0,
                    help="1: the lean forward through torch.compile: with --fixed 1 the "
                         "step's losses (one compilation, checked against eager first), "
                         "else encode and decode with dynamic shapes")
    ap.add_argument("--profile", type=int, default=0,
                    help="N: profile N steps (from step %d) and print the heaviest operations" % PROFILE_FROM)
    ap.add_argument("--hidden", type=int, default=TEXT_CONFIG["hidden_size"],
                    help="model width (the other widths follow it: text_config)")
    ap.add_argument("--fixed", type=int, default=1,
                    help="1 (with the lean forward): fixed-shape batches of mixed kinds "
                         "(tools/train/fixed.py), checked against unpadded ones first")
    ap.add_argument("--parts", type=int, default=32,
                    help="draws (one kind and size each) a fixed-shape batch holds")
    ap.add_argument("--prep-steps", type=int, default=16,
                    help="fixed-shape path: batches made this many steps' at a time")
    ap.add_argument("--graph", type=int, default=1,
                    help="1: with --fixed, each step one CUDA graph replay")
    ap.add_argument("--kind-odds", default="add=2,get=2",
                    help="relative odds of the kinds a draw takes (others 1; '' for equal)")
    ap.add_argument("--amp", type=int, default=0,
                    help="1: with --fixed, the forward under bf16 autocast (fp32 weights and "
                         "losses); if its graph fails to capture, fp32")
    ap.add_argument("--warmup", type=int, default=100, help="steps of linear learning-rate warm-up")
    ap.add_argument("--init", help="start from this fp32 state (DIR-state.pt, saved beside a "
                                   "model) or a saved model's directory (model/default)")
    ap.add_argument("--resume", help="continue the run that saved this (DIR-resume.pt, saved "
                                     "beside a model): its weights, optimizer state, step count "
                                     "and place in the learning-rate schedule (not with --init)")
    ap.add_argument("--schedule-minutes", type=float, default=0.0,
                    help="the learning-rate schedule's length in minutes over all calls; a call "
                         "still stops after --minutes (0: --minutes, or with --resume the "
                         "resumed run's)")
    ap.add_argument("--experts", default="grouped_mm",
                    help="transformers' experts backend (eager, grouped_mm, batched_mm)")
    args = ap.parse_args()
    if args.init and args.resume:
        ap.error("--init and --resume exclude each other (--resume restores the weights too)")
    if args.prep_steps < 1:
        ap.error("--prep-steps: at least 1")
    if args.schedule_minutes < 0:
        ap.error("--schedule-minutes: minutes > 0, or 0 for the default")
    {"train": train, "eval": evaluate, "plot": plot}[args.mode](args)


if __name__ == "__main__":
    main()
