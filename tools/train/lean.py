"""A lean functional forward of DiffusionGemma's text stack, for training.

transformers' eager modules spend most of a small model's training step in
Python and kernel launches (about 150 ms a step for 2.3 M parameters at any
batch size).  This is the same math (docs: ../shared/spec/model.md §3-§5)
written as plain tensor operations over the *same parameter tensors* as
the transformers model it is built on, so the trained weights are saved by
transformers and read by dgemma unchanged.  Eagerly it is hardly faster
(run 49: 144 ms a step at batch 512); what it makes possible is padding
with masks and capturing the step (fixed.py), and torch.compile:

  - attention through torch's scaled_dot_product_attention (scale 1.0, GQA);
  - all experts of a layer in two batched products, weighted by the routing
    weights (zero for the experts a token did not choose): the same sums as
    a top-k dispatch, and the same gradients;
  - the embedding through F.embedding, not an index E[ids]: the index's
    backward (a deterministic index_put over 384 rows for 64,512 ids) took
    13 ms a call, a fifth of the step (run 56's profile);
  - the decoder reads the context's keys and values from the encoder pass
    (no cache object), with every key visible: the task's sequences are
    shorter than the sliding window, so no window applies (asserted).

`check` compares this forward with transformers' on random inputs (encoder
keys, values and logits, decoder logits with and without self-conditioning)
before it is trusted; train.py falls back to transformers' forward if it
disagrees.
"""

import math

import torch
import torch.nn.functional as F


def rms(x, w=None, eps=1e-6):
    """RMSNorm over the last dimension (plain weight, not 1 + w): torch's
    own operation where it has one (one kernel, not five), else spelled
    out."""
    if hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if w is None else y * w


def rope_tables(pos, dim, theta, n_rot):
    """cos and sin [B, T, dim/2] for absolute positions pos [B, T]: pair i
    (dims i and i + dim/2) turns by pos * theta^(-2i/dim) for i < n_rot and
    not at all after (proportional RoPE)."""
    i = torch.arange(dim // 2, device=pos.device, dtype=torch.float32)
    inv = theta ** (-2.0 * i / dim)
    inv = torch.where(i < n_rot, inv, torch.zeros_like(inv))
    ang = pos.float()[..., None] * inv
    return ang.cos(), ang.sin()


def rope(x, cs):
    """x [B, T, heads, D] rotated by tables cs ([B, T, D/2] each)."""
    cos, sin = (t[:, :, None, :] for t in cs)
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Lean:
    """The forward over a DiffusionGemmaForBlockDiffusion's parameters."""

    def __init__(self, model):
        tc = model.config.get_text_config(decoder=True)
        self.tc = tc
        self.dec = model.model.decoder
        self.enc_layers = model.model.encoder.language_model.layers
        self.H = tc.hidden_size
        self.window = tc.sliding_window
        self.cap = tc.final_logit_softcapping
        self.top_k = tc.top_k_experts
        self.emb_scale = self.H ** 0.5
        rp = getattr(tc, "rope_parameters", None) or {}
        self.rope = {}
        for kind, dflt in (("sliding_attention", (10000.0, 1.0)), ("full_attention", (1e6, 0.25))):
            p = rp.get(kind, {}) if isinstance(rp, dict) else {}
            theta = float(p.get("rope_theta", dflt[0]))
            frac = float(p.get("partial_rotary_factor", dflt[1]))
            self.rope[kind] = (theta, frac)
        self.kinds = list(tc.layer_types)

    # -- pieces ---------------------------------------------------------------

    def tables(self, pos):
        """RoPE tables per layer kind for positions pos [B, T]."""
        out = {}
        for kind in set(self.kinds):
            theta, frac = self.rope[kind]
            D = self.dec.layers[self.kinds.index(kind)].self_attn.head_dim
            out[kind] = rope_tables(pos, D, theta, int(frac * D) // 2)
        return out

    def qkv(self, l, a, cs):
        """q [B, nh, T, D], k and v [B, nkv, T, D] of layer l for normed input a."""
        att = self.dec.layers[l].self_attn
        B, T, _ = a.shape
        D = att.head_dim
        q = (a @ att.q_proj.weight.t()).view(B, T, -1, D)
        k_raw = (a @ att.k_proj.weight.t()).view(B, T, -1, D)
        v_raw = k_raw if getattr(att, "v_proj", None) is None else \
            (a @ att.v_proj.weight.t()).view(B, T, -1, D)
        q = rope(rms(q, att.q_norm.weight), cs)
        k = rope(rms(k_raw, att.k_norm.weight), cs)
        v = rms(v_raw)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def ffn(self, l, h):
        """The dense MLP and the experts of layer l on the residual h: f."""
        L = self.dec.layers[l]
        u = rms(h, L.pre_feedforward_layernorm.weight)
        mlp = L.mlp
        d = (F.gelu(u @ mlp.gate_proj.weight.t(), approximate="tanh") * (u @ mlp.up_proj.weight.t())) \
            @ mlp.down_proj.weight.t()
        d = rms(d, L.post_feedforward_layernorm_1.weight)

        r = L.router
        x = rms(h) * r.scale * (self.H ** -0.5)
        p = torch.softmax((x @ r.proj.weight.t()).float(), -1)
        top, idx = p.topk(self.top_k, -1)
        # the chosen experts' scales applied after the scatter, as a product
        # over [E]: the same products as scale[idx] before it, without an
        # index whose backward (a deterministic index_put over 8 experts,
        # 2.4 ms a call) cost more than the layer (run 56's profile)
        w = torch.zeros_like(p).scatter(-1, idx, top / top.sum(-1, keepdim=True)) * \
            r.per_expert_scale                                   # [B, T, E]
        ex = L.experts
        v = rms(h, L.pre_feedforward_layernorm_2.weight)
        I = ex.down_proj.shape[-1]
        gu = torch.einsum("bth,eoh->bteo", v, ex.gate_up_proj)
        y = F.gelu(gu[..., :I], approximate="tanh") * gu[..., I:]
        m = torch.einsum("btei,ehi,bte->bth", y, ex.down_proj, w)
        m = rms(m, L.post_feedforward_layernorm_2.weight)
        return rms(d + m, L.post_feedforward_layernorm.weight)

    def layer(self, l, x, cs, ctx_kv, causal, scalar, mask=None):
        """One layer: x [B, T, H] -> (x', (k, v) of these rows).  mask
        (bool [B, 1, T, keys], true: may attend), if given, replaces the
        causal or all-visible pattern."""
        L = self.dec.layers[l]
        a = rms(x, L.input_layernorm.weight)
        q, k, v = self.qkv(l, a, cs)
        if ctx_kv is not None:
            kk = torch.cat([ctx_kv[0], k], 2)
            vv = torch.cat([ctx_kv[1], v], 2)
        else:
            kk, vv = k, v
        o = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask,
                                           is_causal=causal and mask is None, scale=1.0,
                                           enable_gqa=True)
        B, T, _ = x.shape
        o = o.transpose(1, 2).reshape(B, T, -1) @ L.self_attn.o_proj.weight.t()
        h = x + rms(o, L.post_attention_layernorm.weight)
        return (h + self.ffn(l, h)) * scalar, (k, v)

    def logits(self, x):
        """Soft-capped logits of the final hidden states x."""
        y = rms(x, self.dec.norm.weight) @ self.dec.embed_tokens.weight.t()
        return torch.tanh(y / self.cap) * self.cap

    # -- the two modes --------------------------------------------------------

    def encode(self, ids, pos=None, mask=None):
        """Encoder mode over ids [B, T] at positions 0..T-1 (causal):
        (final hidden states [B, T, H] before the final norm, per-layer
        (k, v) [B, nkv, T, D]).  Padded rows: positions pos [B, T] and an
        attention mask [B, 1, T, T] instead."""
        B, T = ids.shape
        assert T < self.window, "sequence longer than the sliding window"
        if pos is None:
            pos = torch.arange(T, device=ids.device)[None].expand(B, -1)
        tabs = self.tables(pos)
        x = F.embedding(ids, self.dec.embed_tokens.weight) * self.emb_scale
        kv = []
        for l, kind in enumerate(self.kinds):
            x, kvl = self.layer(l, x, tabs[kind], None, True, self.enc_layers[l].layer_scalar,
                                mask)
            kv.append(kvl)
        return x, kv

    def decode(self, ids, ctx_kv, start, sc_logits=None, sc_mask=None, pos=None, ctx_mask=None):
        """Decoder mode over canvas ids [B, CL] at positions start.., reading
        the context's per-layer (k, v); sc_logits [B, CL, V] (the previous
        pass's logits over its temperature) condition rows where sc_mask
        [B] is true.  Returns the canvas logits [B, CL, V].  Padded rows:
        positions pos [B, CL] and ctx_mask [B, 1, 1, keys] (true: a context
        key the canvas may read; every canvas key is read) instead."""
        B, T = ids.shape
        if pos is None:
            assert start + T < self.window, "context longer than the sliding window"
            pos = torch.arange(start, start + T, device=ids.device)[None].expand(B, -1)
        mask = None
        if ctx_mask is not None:
            mask = torch.cat([ctx_mask.expand(B, 1, T, ctx_mask.shape[-1]),
                              torch.ones((B, 1, T, T), dtype=torch.bool, device=ids.device)], -1)
        tabs = self.tables(pos)
        E = self.dec.embed_tokens.weight
        x = F.embedding(ids, E) * self.emb_scale
        if sc_logits is not None:
            sc = self.dec.self_conditioning
            soft = torch.softmax(sc_logits.float(), -1) @ E * self.emb_scale
            if sc_mask is not None:
                soft = soft * sc_mask.to(soft.dtype)[:, None, None]
            u = rms(soft, sc.pre_norm.weight)
            x = x + (F.gelu(u @ sc.gate_proj.weight.t(), approximate="tanh") *
                     (u @ sc.up_proj.weight.t())) @ sc.down_proj.weight.t()
        x = rms(x)
        for l, kind in enumerate(self.kinds):
            x, _ = self.layer(l, x, tabs[kind], ctx_kv[l], False, self.dec.layers[l].layer_scalar,
                              mask)
        return self.logits(x)


def check(model, lean, V, dev, P=21, CL=32, B=3):
    """transformers' forward against the lean one on random ids, in fp32
    without TF32: the largest absolute differences of the encoder's cached
    keys and values, the encoder's logits and the decoder's logits (with
    per-row self-conditioning).  Returns (worst difference, details)."""
    from transformers import DynamicCache
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with torch.no_grad():
            g = torch.Generator(device=dev).manual_seed(3)
            ctx = torch.randint(0, V, (B, P), device=dev, generator=g)
            canvas = torch.randint(0, V, (B, CL), device=dev, generator=g)
            cache = DynamicCache(config=model.config.get_text_config(decoder=True))
            enc = model.model.encoder(input_ids=ctx, past_key_values=cache,
                                      position_ids=torch.arange(P, device=dev)[None].expand(B, -1))
            hf_enc = torch.tanh(model.lm_head(enc.last_hidden_state).float() / lean.cap) * lean.cap
            pos = torch.arange(P, P + CL, device=dev)[None].expand(B, -1)
            z1 = model(decoder_input_ids=canvas, past_key_values=cache, decoder_position_ids=pos).logits
            sc = z1 / 0.6
            mask = torch.tensor([True, False, True][:B], device=dev)
            z2 = model(decoder_input_ids=canvas, past_key_values=cache, decoder_position_ids=pos,
                       self_conditioning_logits=sc, self_conditioning_mask=mask).logits

            x, kv = lean.encode(ctx)
            le_enc = lean.logits(x)
            l1 = lean.decode(canvas, kv, P)
            l2 = lean.decode(canvas, kv, P, sc, mask)
            d = {
                "encoder keys": max(float((kv[i][0] - cache.layers[i].keys[:, :, :P]).abs().max())
                                    for i in range(len(kv))),
                "encoder values": max(float((kv[i][1] - cache.layers[i].values[:, :, :P]).abs().max())
                                      for i in range(len(kv))),
                "encoder logits": float((le_enc - hf_enc).abs().max()),
                "decoder logits": float((l1 - z1).abs().max()),
                "decoder logits, self-conditioned": float((l2 - z2).abs().max()),
            }
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return max(d.values()) if all(math.isfinite(v) for v in d.values()) else math.inf, d
