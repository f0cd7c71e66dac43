"""Fixed-shape training batches, and the training step as one CUDA graph.

A training step of the small model is thousands of small operations; their
launches, not the arithmetic, set its time.  A CUDA graph replays them
without the host, but needs the same shapes every step, and the task's
batches come in many (each draw is one kind and size).  So every example
is laid out in one fixed row of LP + 2 CL ids:

    [<pad> ... <pad>][prompt (p ids)][canvas 0][canvas 1 or <pad>s]
     LP - p             ends at LP

with the prompt's first id at position 0 (RoPE sees the same positions as
unpadded), an attention mask that hides the pads from every real query
(a pad query sees only itself, so no softmax is empty), and loss weights
that count only real positions.  Every draw's rows therefore sit in one
batch of mixed kinds and sizes, and the arithmetic of each real row is
that of the unpadded batch (`check` compares them before training).

The step (encoder pass, the decoder's two self-conditioning passes, the
losses, backward, clipping and AdamW) is captured once on these static
tensors; each step copies a new batch into them and replays the graph.
"""

import torch
import torch.nn.functional as F

import task

LP = 62          # the longest prompt: "get k " and 8 pairs of 4 digits, with <bos>
NCANVAS = 2      # the longest answer (48 characters and <eos>) spans two canvases


class Batch:
    """One fixed-shape batch (see the module's comment); all on the device.
    ids, pos [B, L]; enc_mask [B, 1, L, L]; enc_w [B, L - 1] (1 where the
    position and the next are real); noisy, target, dec_pos [B, CL];
    ctx_mask [B, 1, 1, L] (context keys the canvas reads); weight [B]
    (0: a prompt reserved for evaluation); use_sc [B]; temp [B, 1, 1];
    kind [B] (index into task.TASKS)."""

    FIELDS = ("ids", "pos", "enc_mask", "enc_w", "noisy", "target", "dec_pos", "ctx_mask",
              "weight", "use_sc", "temp", "kind")

    def copy_(self, other):
        for f in self.FIELDS:
            getattr(self, f).copy_(getattr(other, f))

    def map(self, fn):
        """A new Batch of fn(field) for every field."""
        b = Batch()
        for f in self.FIELDS:
            setattr(b, f, fn(getattr(self, f)))
        return b

    def take(self, idx):
        """The rows idx (a device LongTensor) of every field, a new Batch."""
        return self.map(lambda t: t[idx])

    def rows(self, lo, hi):
        """Rows lo..hi-1 of every field (views), a new Batch."""
        return self.map(lambda t: t[lo:hi])


def assemble(parts, CL, V, g, dev):
    """parts: [(kind index, prompt [b, p] with <bos>, canvases [b, n CL],
    weight [b])], n of 1 or 2.  Each row's canvas block is drawn uniformly
    from its blocks, its noise level t ~ U(0.001, 1), self-conditioning
    with probability 1/2 and its temperature ~ U(0.4, 0.8), with generator
    g.  Returns a Batch."""
    L = LP + NCANVAS * CL
    ar = torch.arange(L, device=dev)
    rows = {f: [] for f in ("ids", "pos", "real", "start", "dec_pos", "weight", "kind")}
    for kind, prompt, canv, weight in parts:
        b, p = prompt.shape
        nblk = canv.shape[1] // CL
        assert p <= LP and 1 <= nblk <= NCANVAS, (p, nblk)
        off = LP - p
        ids = torch.full((b, L), task.PAD, dtype=torch.long, device=dev)
        ids[:, off:LP] = prompt
        ids[:, LP:LP + nblk * CL] = canv
        real = ((ar >= off) & (ar < LP + nblk * CL))[None].expand(b, -1)
        blk = torch.randint(0, nblk, (b,), device=dev, generator=g)
        rows["ids"].append(ids)
        rows["pos"].append((ar - off).clamp(min=0)[None].expand(b, -1))
        rows["real"].append(real)
        rows["start"].append(LP + blk * CL)
        rows["dec_pos"].append((p + blk * CL)[:, None] + torch.arange(CL, device=dev)[None])
        rows["weight"].append(weight)
        rows["kind"].append(torch.full((b,), kind, dtype=torch.long, device=dev))
    cat = {f: torch.cat(v, 0) for f, v in rows.items()}
    B = cat["ids"].shape[0]
    real, start = cat["real"], cat["start"]
    out = Batch()
    out.ids, out.pos, out.dec_pos = cat["ids"], cat["pos"].contiguous(), cat["dec_pos"]
    out.weight, out.kind = cat["weight"].float(), cat["kind"]
    causal = ar[None, :] <= ar[:, None]                                   # [q, k]
    eye = torch.eye(L, dtype=torch.bool, device=dev)
    out.enc_mask = ((causal[None] & real[:, None, :]) | eye[None])[:, None]
    out.enc_w = (real[:, :-1] & real[:, 1:]).float()
    out.target = torch.gather(out.ids, 1, start[:, None] + torch.arange(CL, device=dev)[None])
    out.ctx_mask = (real & (ar[None] < start[:, None]))[:, None, None, :]
    t = 0.001 + 0.999 * torch.rand((B, 1), device=dev, generator=g)
    out.noisy = torch.where(torch.rand((B, CL), device=dev, generator=g) < t,
                            torch.randint(0, V, (B, CL), device=dev, generator=g), out.target)
    out.use_sc = torch.rand((B,), device=dev, generator=g) < 0.5
    out.temp = 0.4 + 0.4 * torch.rand((B, 1, 1), device=dev, generator=g)
    return out


def passes(lean, S, V):
    """The passes of a training step on batch S: (encoder cross-entropy per
    row [B], mean over its real positions; the decoder's first-pass logits
    z1, without gradient; the self-conditioned logits z [B, CL, V])."""
    B, L = S.ids.shape
    x, kv = lean.encode(S.ids, S.pos, S.enc_mask)
    ce = F.cross_entropy(lean.logits(x[:, :-1]).reshape(-1, V), S.ids[:, 1:].reshape(-1),
                         reduction="none").view(B, L - 1)
    enc_row = (ce * S.enc_w).sum(1) / S.enc_w.sum(1).clamp(min=1.0)
    with torch.no_grad():
        z1 = lean.decode(S.noisy, kv, 0, pos=S.dec_pos, ctx_mask=S.ctx_mask)
    z = lean.decode(S.noisy, kv, 0, z1 / S.temp, S.use_sc, pos=S.dec_pos, ctx_mask=S.ctx_mask)
    return enc_row, z1, z


def losses(lean, S, V):
    """(canvas loss, encoder loss, per-row canvas accuracy [B]) of batch S:
    the same per-row means, weighted by S.weight, as the unpadded step."""
    B = S.ids.shape[0]
    enc_row, _, z = passes(lean, S, V)
    wsum = S.weight.sum().clamp(min=1.0)
    enc_loss = (enc_row * S.weight).sum() / wsum
    cl = F.cross_entropy(z.reshape(-1, V), S.target.reshape(-1), reduction="none")
    canvas_loss = (cl.view(B, -1).mean(1) * S.weight).sum() / wsum
    acc = (z.argmax(-1) == S.target).float().mean(1)
    return canvas_loss, enc_loss, acc


def check(lean, parts, CL, V, dev):
    """The padded batch of parts against each part unpadded (lean.encode
    and lean.decode as the plain training step calls them), fp32 without
    TF32: the largest absolute differences of the canvas logits (first and
    self-conditioned pass) and of the per-row encoder losses."""
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            g = torch.Generator(device=dev).manual_seed(11)
            S = assemble(parts, CL, V, g, dev)
            enc_row, z1, z2 = passes(lean, S, V)
            d = {"canvas logits": 0.0, "canvas logits, self-conditioned": 0.0,
                 "encoder loss per row": 0.0}
            r0 = 0
            for _, prompt, canv, _ in parts:
                b, p = prompt.shape
                full = torch.cat([prompt, canv], 1)
                ux, ukv = lean.encode(full)
                uce = F.cross_entropy(lean.logits(ux[:, :-1]).reshape(-1, V),
                                      full[:, 1:].reshape(-1), reduction="none").view(b, -1)
                d["encoder loss per row"] = max(d["encoder loss per row"], float(
                    (uce.mean(1) - enc_row[r0:r0 + b]).abs().max()))
                blk = (S.dec_pos[r0:r0 + b, 0] - p) // CL
                for bb in blk.unique().tolist():
                    rows = (blk == bb).nonzero().flatten()
                    P = p + bb * CL
                    ctx = [(k[rows][:, :, :P], v[rows][:, :, :P]) for k, v in ukv]
                    noisy = S.noisy[r0 + rows]
                    u1 = lean.decode(noisy, ctx, P)
                    u2 = lean.decode(noisy, ctx, P, u1 / S.temp[r0 + rows], S.use_sc[r0 + rows])
                    d["canvas logits"] = max(d["canvas logits"],
                                             float((u1 - z1[r0 + rows]).abs().max()))
                    d["canvas logits, self-conditioned"] = max(
                        d["canvas logits, self-conditioned"], float((u2 - z2[r0 + rows]).abs().max()))
                r0 += b
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    # (a NaN anywhere is the worst: max() could pass over it)
    return (max(d.values()) if all(v == v for v in d.values()) else float("inf")), d


def compile_losses(lean, params, S, V, amp, tol):
    """losses through torch.compile (inductor, the shapes fixed: one
    compilation serves every step), checked against the eager losses on
    batch S under autocast(amp), with the same matrix-product settings
    the steps use: the largest absolute differences of the canvas and
    encoder losses, and of each parameter's gradient relative to that
    gradient's largest magnitude.  Returns (the compiled function, or
    None when compiling failed or a difference exceeds tol; the
    differences, or the error).  The gradients are left cleared."""
    d = {}
    try:
        fn = torch.compile(losses, dynamic=False)
        outs, grads = [], []
        for f in (losses, fn):
            for p in params:
                p.grad = None
            with autocast(amp):
                cl, el, _ = f(lean, S, V)
            (cl + el).backward()
            outs.append((float(cl), float(el)))
            grads.append([p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)
                          for p in params])
        d["canvas loss"] = abs(outs[0][0] - outs[1][0])
        d["encoder loss"] = abs(outs[0][1] - outs[1][1])
        d["gradients, relative"] = max(
            float((b - a).abs().max() / a.abs().max().clamp(min=1e-12))
            for a, b in zip(grads[0], grads[1]))
    except Exception as e:  # noqa: BLE001 (any failure: eager)
        return None, {"error %s: %s" % (type(e).__name__, str(e)[:300]): float("inf")}
    finally:
        for p in params:
            p.grad = None
    # (a NaN fails the comparison: not accepted)
    return (fn if all(v <= tol for v in d.values()) else None), d


def autocast(amp):
    """The forward's autocast context: bf16 matrix products (fp32 weights,
    fp32 losses) when amp, else none.  No cast cache, so it can be
    captured in a CUDA graph."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=bool(amp), cache_enabled=False)


class GraphStep:
    """The whole training step on the static batch S, captured in a CUDA
    graph after three warm-up steps at learning rate 0 on a side stream
    (the optimizer must be capturable, its learning rate a device tensor),
    the forward under autocast(amp) through loss_fn (losses, or
    compile_losses' function).  step() replays it and returns (canvas
    loss, encoder loss, row accuracy) tensors, overwritten by the next
    step."""

    def __init__(self, model, lean, opt, S, V, clip, amp=False, loss_fn=losses):
        self.S = S
        params = [p for p in model.parameters() if p.requires_grad]

        def body():
            with autocast(amp):
                cl, el, acc = loss_fn(lean, S, V)
            (cl + el).backward()
            torch.nn.utils.clip_grad_norm_(params, clip)
            opt.step()
            return cl.detach(), el.detach(), acc.detach()

        lr = opt.param_groups[0]["lr"]
        keep = lr.clone()
        lr.zero_()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    opt.zero_grad(set_to_none=True)
                    body()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            opt.zero_grad(set_to_none=True)
            with torch.cuda.graph(self.graph):
                self.out = body()
        finally:
            lr.copy_(keep)

    def step(self):
        self.graph.replay()
        return self.out
