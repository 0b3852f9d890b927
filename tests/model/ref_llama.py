#!/usr/bin/env python3
"""An independent NumPy reference of the LLaMA forward pass, read from a GGUF file.

It exists to check the C implementation (model/llama.c over kernels/) by its
logits.  It shares no code with the C side: the GGUF file is read with the PyPI
`gguf` package (GGUFReader, and gguf.quants.dequantize for the quantized
types), and the forward pass below is written out plainly, top to bottom, in
the manner of llama2.c.  Everything is computed in float64, so the reference is
the more accurate of the two sides.

Conventions (each was checked; see `--selfcheck`):

  * GGUF lists a tensor's shape as ne[0], ne[1], ... with ne[0] the contiguous
    (input) dimension.  A matrix with ne = [n_in, n_out] is therefore a
    row-major NumPy array of shape (n_out, n_in), and y = W @ x.
  * Rotary embedding: llama.cpp's convert script permutes the rows of Q and K
    of HF LLaMA checkpoints so that the GGUF model uses the "normal" rope
    (llama.cpp's LLAMA_ROPE_TYPE_NORM): the adjacent pair (x[2i], x[2i+1]) of
    each head is rotated by pos * base^(-2i/n_rot).  Not the NeoX halves.
  * RMSNorm: x / sqrt(mean(x^2) + eps) * w.
  * Attention: scale 1/sqrt(head_dim), causal softmax; grouped-query attention:
    query head h reads KV head h // (n_heads / n_kv_heads).
  * FFN: SwiGLU, down(silu(gate(x)) * up(x)).
  * Output: output_norm, then logits = W_out @ x, where W_out is output.weight
    or, when the file has none (tied embeddings), token_embd.weight.

Architectures (general.architecture; their keys carry its name as prefix):
  * llama: as above; with rope_freqs.weight (Llama 3), pair i's angle is
    divided by rope_freqs[i].
  * qwen2: Q, K and V get their biases (blk.N.attn_{q,k,v}.bias); NeoX rope.
  * qwen3: Q and K are RMS-normed per head (attn_{q,k}_norm, before rope);
    NeoX rope; heads may be larger than dim / n_heads (attention.key_length).
  * YaRN (rope.scaling.type yarn, any of these): each pair's angle mixes the
    interpolated one (divided by rope.scaling.factor) and the original by a
    ramp over the pairs between the correction dims of beta 32 and 1 at
    rope.scaling.original_context_length; cos and sin times
    1 + 0.1 ln(factor) (and rope.scaling.attn_factor, where given).
  * phi3: attn_qkv.weight holds Q, K and V (rows in that order), ffn_up.weight
    the gate then the up projection; NeoX rope. With LongRoPE
    (rope_factors_long/short.weight), pair i's angle is divided by the long
    factor where the context (the cache's capacity) passes
    rope.scaling.original_context_length, else by the short one, and cos
    and sin are multiplied by rope.scaling.attn_factor.
  * gemma3: the embedding times sqrt(dim); Q/K normed per head as qwen3;
    RMSNorm of the attention's and of the FFN's output (post_attention_norm,
    post_ffw_norm) before each residual add; GELU (tanh) gating; NeoX rope.
    Five of each six layers (those with (l + 1) % 6 != 0) see only the last
    attention.sliding_window positions and rotate at base 10000.

Module use:
    m = load("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    logits = forward(m, [1, 2, 3])          # [3, vocab]
    ids = greedy(m, [1, 2, 3], 32)          # 32 ids, incremental KV cache

CLI:
    ref_llama.py --model M --tokens 1,2,3 [--steps 32] [--out FILE.json]
    ref_llama.py --model M --text "The capital of France is" [--chat] [--steps 8]
    ref_llama.py --model M --selfcheck
"""

import argparse
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass

import numpy as np
import gguf

CACHE_DIR = os.path.expanduser("~/.cache/dualpath/ref")
CACHE_VERSION = 3  # bump when the cached content or its layout changes


# --------------------------------------------------------------------------
# The model


@dataclass
class Config:
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab: int
    rope_base: float
    n_rot: int      # how many leading dims of each head the rotary embedding touches
    eps: float
    arch: str = "llama"
    swa_window: int = 0      # gemma3: the window of its sliding-window layers
    rope_base_swa: float = 10000.0
    attn_scale: float = 0.0  # 0: 1 / sqrt(head_dim)
    n_ctx_orig: int = 0      # LongRoPE, YaRN: rope.scaling.original_context_length
    yarn_factor: float = 0.0  # YaRN: rope.scaling.factor (0: no YaRN)
    rope_mscale: float = 1.0  # LongRoPE: rope.scaling.attn_factor (cos and sin times it)

    def window(self, l):
        """gemma3: five sliding-window layers, then a global one."""
        return self.swa_window if self.swa_window and (l + 1) % 6 else 0


@dataclass
class Layer:
    attn_norm: np.ndarray   # [dim]
    wq: np.ndarray          # [n_heads * head_dim, dim]
    wk: np.ndarray          # [n_kv_heads * head_dim, dim]
    wv: np.ndarray          # [n_kv_heads * head_dim, dim]
    wo: np.ndarray          # [dim, n_heads * head_dim]
    ffn_norm: np.ndarray    # [dim]
    w_gate: np.ndarray      # [ffn_dim, dim]
    w_up: np.ndarray        # [ffn_dim, dim]
    w_down: np.ndarray      # [dim, ffn_dim]
    bq: np.ndarray = None   # qwen2: [n_heads * head_dim]
    bk: np.ndarray = None   # qwen2: [n_kv_heads * head_dim]
    bv: np.ndarray = None
    q_norm: np.ndarray = None  # qwen3, gemma3: [head_dim]
    k_norm: np.ndarray = None
    post_attn_norm: np.ndarray = None  # gemma3: [dim]
    post_ffn_norm: np.ndarray = None


@dataclass
class Model:
    path: str
    cfg: Config
    tok_embd: np.ndarray    # [vocab, dim]
    layers: list
    out_norm: np.ndarray    # [dim]
    w_out: np.ndarray       # [vocab, dim]; the same array as tok_embd when tied
    tied: bool
    rope_mode: str = "norm"  # "norm" (llama) or "neox" (qwen2, qwen3; selfcheck for llama)
    rope_freqs: np.ndarray = None  # Llama 3's per-pair factors, [n_rot / 2]
    rope_long: np.ndarray = None   # LongRoPE's factors past n_ctx_orig, [n_rot / 2]
    rope_short: np.ndarray = None  # ... and within it


def read_config(reader):
    def get(key, default=None):
        f = reader.fields.get(key)
        if f is None:
            if default is None:
                raise KeyError(f"GGUF metadata lacks {key}")
            return default
        return f.contents()

    arch = get("general.architecture")
    if arch not in ("llama", "qwen2", "qwen3", "phi3", "gemma3"):
        raise ValueError(f"architecture {arch!r} is not supported (llama, qwen2, qwen3, phi3, gemma3)")
    a = arch + "."
    dim = int(get(a + "embedding_length"))
    n_heads = int(get(a + "attention.head_count"))
    head_dim = int(get(a + "attention.key_length", dim // n_heads))
    vocab = get(a + "vocab_size", -1)
    if vocab == -1:
        vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    yarn = str(get(a + "rope.scaling.type", "none")) == "yarn"
    for key in (a + "rope.scaling.type", a + "rope.scaling.factor"):
        if not yarn and key in reader.fields and \
                str(reader.fields[key].contents()) not in ("none", "1.0"):
            raise ValueError(f"{key} = {reader.fields[key].contents()} is not supported")
    return Config(
        n_layers=int(get(a + "block_count")),
        dim=dim,
        n_heads=n_heads,
        n_kv_heads=int(get(a + "attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        ffn_dim=int(get(a + "feed_forward_length")),
        vocab=int(vocab),
        rope_base=float(get(a + "rope.freq_base", 10000.0)),
        n_rot=int(get(a + "rope.dimension_count", head_dim)),
        eps=float(get(a + "attention.layer_norm_rms_epsilon")),
        arch=arch,
        swa_window=int(get(a + "attention.sliding_window", 0)) if arch == "gemma3" else 0,
        n_ctx_orig=int(get(a + "rope.scaling.original_context_length", 0)),
        yarn_factor=float(get(a + "rope.scaling.factor", 1.0)) if yarn else 0.0,
        rope_mscale=float(get(a + "rope.scaling.attn_factor", 1.0)),
    )


def tensor_to_array(t):
    """Dequantize one GGUF tensor to float32, shaped [ne[n-1], ..., ne[0]]."""
    a = gguf.quants.dequantize(t.data, t.tensor_type)
    shape = tuple(int(n) for n in reversed(t.shape))
    return np.ascontiguousarray(a, dtype=np.float32).reshape(shape)


def file_digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()[:16]


def read_file(path):
    """(Config, {tensor name: float32 array}) of a GGUF file.

    Parsing the GGUF metadata and dequantizing take seconds, so the result is
    cached in ~/.cache/dualpath/ref/, keyed by the file's sha256 prefix."""
    cache = os.path.join(CACHE_DIR, f"{file_digest(path)}-v{CACHE_VERSION}.npz")
    if os.path.exists(cache):
        try:
            with np.load(cache) as z:
                cfg = Config(**json.loads(str(z["__config__"])))
                return cfg, {k: z[k] for k in z.files if k != "__config__"}
        except Exception as e:  # a damaged or stale cache is rebuilt
            print(f"ref_llama: ignoring unreadable cache {cache}: {e}", file=sys.stderr)
    reader = gguf.GGUFReader(path)
    cfg = read_config(reader)
    tensors = {t.name: tensor_to_array(t) for t in reader.tensors}
    try:
        os.makedirs(CACHE_DIR, exist_ok=True)
        tmp = cache + f".tmp{os.getpid()}.npz"
        np.savez(tmp, __config__=np.array(json.dumps(cfg.__dict__)), **tensors)
        os.replace(tmp, cache)
    except OSError as e:
        print(f"ref_llama: could not write cache {cache}: {e}", file=sys.stderr)
    return cfg, tensors


def load(path):
    """The model, all weights dequantized (float32, exact) and held as float64."""
    cfg, t = read_file(path)
    f64 = lambda name: t[name].astype(np.float64)

    def check(name, shape):
        if t[name].shape != shape:
            raise ValueError(f"{name}: shape {t[name].shape}, expected {shape}")

    q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        if p + "attn_qkv.weight" in t:             # phi3: split the fused tensors
            check(p + "attn_qkv.weight", (q_dim + 2 * kv_dim, cfg.dim))
            qkv = t.pop(p + "attn_qkv.weight")
            t[p + "attn_q.weight"] = qkv[:q_dim]
            t[p + "attn_k.weight"] = qkv[q_dim:q_dim + kv_dim]
            t[p + "attn_v.weight"] = qkv[q_dim + kv_dim:]
        if cfg.arch == "phi3":
            check(p + "ffn_up.weight", (2 * cfg.ffn_dim, cfg.dim))
            gu = t.pop(p + "ffn_up.weight")
            t[p + "ffn_gate.weight"] = gu[:cfg.ffn_dim]
            t[p + "ffn_up.weight"] = gu[cfg.ffn_dim:]
        for name, shape in [("attn_q", (q_dim, cfg.dim)), ("attn_k", (kv_dim, cfg.dim)),
                            ("attn_v", (kv_dim, cfg.dim)), ("attn_output", (cfg.dim, q_dim)),
                            ("ffn_gate", (cfg.ffn_dim, cfg.dim)), ("ffn_up", (cfg.ffn_dim, cfg.dim)),
                            ("ffn_down", (cfg.dim, cfg.ffn_dim)),
                            ("attn_norm", (cfg.dim,)), ("ffn_norm", (cfg.dim,))]:
            check(p + name + ".weight", shape)
        opt = {}
        if cfg.arch == "qwen2":
            for name, n in (("bq", q_dim), ("bk", kv_dim), ("bv", kv_dim)):
                check(p + f"attn_{name[1]}.bias", (n,))
                opt[name] = f64(p + f"attn_{name[1]}.bias")
        if cfg.arch in ("qwen3", "gemma3"):
            for name in ("q_norm", "k_norm"):
                check(p + f"attn_{name}.weight", (cfg.head_dim,))
                opt[name] = f64(p + f"attn_{name}.weight")
        if cfg.arch == "gemma3":
            for name, tn in (("post_attn_norm", "post_attention_norm"), ("post_ffn_norm", "post_ffw_norm")):
                check(p + tn + ".weight", (cfg.dim,))
                opt[name] = f64(p + tn + ".weight")
        layers.append(Layer(
            **opt,
            attn_norm=f64(p + "attn_norm.weight"),
            wq=f64(p + "attn_q.weight"),
            wk=f64(p + "attn_k.weight"),
            wv=f64(p + "attn_v.weight"),
            wo=f64(p + "attn_output.weight"),
            ffn_norm=f64(p + "ffn_norm.weight"),
            w_gate=f64(p + "ffn_gate.weight"),
            w_up=f64(p + "ffn_up.weight"),
            w_down=f64(p + "ffn_down.weight"),
        ))
    check("token_embd.weight", (cfg.vocab, cfg.dim))
    tok_embd = f64("token_embd.weight")
    tied = "output.weight" not in t
    if not tied:
        check("output.weight", (cfg.vocab, cfg.dim))
    w_out = tok_embd if tied else f64("output.weight")
    rope_freqs = None
    if "rope_freqs.weight" in t:
        check("rope_freqs.weight", (cfg.n_rot // 2,))
        rope_freqs = f64("rope_freqs.weight")
    longrope = {}
    if "rope_factors_long.weight" in t:
        for name in ("long", "short"):
            check(f"rope_factors_{name}.weight", (cfg.n_rot // 2,))
            longrope["rope_" + name] = f64(f"rope_factors_{name}.weight")
    return Model(path=path, cfg=cfg, tok_embd=tok_embd, layers=layers,
                 out_norm=f64("output_norm.weight"), w_out=w_out, tied=tied,
                 rope_mode="neox" if cfg.arch in ("qwen2", "qwen3", "phi3", "gemma3") else "norm",
                 rope_freqs=rope_freqs, **longrope)


# --------------------------------------------------------------------------
# The forward pass


def rmsnorm(x, w, eps):
    # x: [T, dim]
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def softmax(x):
    x = x - np.max(x, axis=-1, keepdims=True)
    e = np.exp(x)
    return e / np.sum(e, axis=-1, keepdims=True)


def log_softmax(x):
    """log(softmax(x)) over the last axis (what scoring compares)."""
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def rope(x, positions, cfg, mode="norm", freqs=None, base=None, mscale=1.0):
    """Rotary embedding of x: [T, n_h, head_dim] at the given positions.

    mode "norm": rotate adjacent pairs (x[2i], x[2i+1]) (llama.cpp's default, and
    what GGUF llama files are converted for).  mode "neox": rotate (x[i],
    x[i + n_rot/2]), the HF layout; only for the self-check."""
    half = cfg.n_rot // 2
    inv_freq = (base or cfg.rope_base) ** (-2.0 * np.arange(half) / cfg.n_rot)  # [half]
    if freqs is not None:                                                 # Llama 3
        inv_freq = inv_freq / freqs
    if cfg.yarn_factor and base is None:
        # YaRN: interpolated (1 / factor) below the ramp, original above it,
        # the ramp over the pairs between the correction dims of beta 32
        # and 1 at the original context; cos and sin times 1 + 0.1 ln(factor)
        def corr(beta):
            return cfg.n_rot * math.log(cfg.n_ctx_orig / (beta * 2 * math.pi)) / \
                (2 * math.log(cfg.rope_base))
        lo, hi = max(0.0, math.floor(corr(32.0))), min(cfg.n_rot - 1.0, math.ceil(corr(1.0)))
        ramp = 1.0 - np.clip((np.arange(half) - lo) / max(0.001, hi - lo), 0.0, 1.0)
        inv_freq = inv_freq / cfg.yarn_factor * (1.0 - ramp) + inv_freq * ramp
        mscale = mscale * (1.0 + 0.1 * math.log(cfg.yarn_factor))
    angle = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq   # [T, half]
    cos = np.cos(angle)[:, None, :] * mscale                              # [T, 1, half]
    sin = np.sin(angle)[:, None, :] * mscale
    out = x.copy()
    if mode == "norm":
        a, b = x[..., 0:cfg.n_rot:2], x[..., 1:cfg.n_rot:2]
        out[..., 0:cfg.n_rot:2] = a * cos - b * sin
        out[..., 1:cfg.n_rot:2] = a * sin + b * cos
    elif mode == "neox":
        a, b = x[..., :half], x[..., half:cfg.n_rot]
        out[..., :half] = a * cos - b * sin
        out[..., half:cfg.n_rot] = a * sin + b * cos
    else:
        raise ValueError(mode)
    return out


class KVCache:
    """Keys (already rotated) and values of every position seen so far.

    kv_dtype "f16" rounds them to half precision as they are stored, which is
    what the daemon's default KV cache (kv_cache_type = f16) keeps and its
    attention reads: against that, the exact kernels agree to about 1e-5
    nats; without it the rounding alone is about 1e-3 nats per token."""

    def __init__(self, cfg, capacity, kv_dtype="f32"):
        if kv_dtype not in ("f32", "f16"):
            raise ValueError("kv_dtype must be f32 or f16")
        shape = (cfg.n_layers, capacity, cfg.n_kv_heads, cfg.head_dim)
        self.k = np.zeros(shape)
        self.v = np.zeros(shape)
        self.n = 0  # positions filled
        self.round = (lambda a: a.astype(np.float16).astype(np.float64)) if kv_dtype == "f16" \
            else (lambda a: a)


def forward_chunk(model, cache, tokens):
    """Run `tokens` at positions cache.n, cache.n+1, ... attending to everything
    in the cache before them and causally among themselves.  Appends their K/V
    to the cache and returns the logits, [len(tokens), vocab]."""
    cfg = model.cfg
    T, p0 = len(tokens), cache.n
    if p0 + T > cache.k.shape[1]:
        raise ValueError("KV cache too small")
    positions = np.arange(p0, p0 + T)
    group = cfg.n_heads // cfg.n_kv_heads          # query heads per KV head
    scale = cfg.attn_scale or 1.0 / math.sqrt(cfg.head_dim)
    gemma = cfg.arch == "gemma3"
    # mask[t, s] is True where query t (at p0 + t) may not see key s
    mask = np.arange(p0 + T)[None, :] > positions[:, None]

    x = model.tok_embd[np.asarray(tokens)]         # [T, dim]
    if gemma:
        x = x * math.sqrt(cfg.dim)
    freqs, mscale = model.rope_freqs, 1.0
    if model.rope_long is not None:                # LongRoPE: by the context (the cache's size)
        freqs = model.rope_long if cache.k.shape[1] > cfg.n_ctx_orig else model.rope_short
    mscale = cfg.rope_mscale
    for l, L in enumerate(model.layers):
        win = cfg.window(l)
        base = cfg.rope_base_swa if win else None
        lmask = mask | (positions[:, None] - np.arange(p0 + T)[None, :] >= win) if win else mask
        # attention
        h = rmsnorm(x, L.attn_norm, cfg.eps)
        q, k, v = h @ L.wq.T, h @ L.wk.T, h @ L.wv.T
        if L.bq is not None:                       # qwen2
            q, k, v = q + L.bq, k + L.bk, v + L.bv
        q = q.reshape(T, cfg.n_heads, cfg.head_dim)
        k = k.reshape(T, cfg.n_kv_heads, cfg.head_dim)
        v = v.reshape(T, cfg.n_kv_heads, cfg.head_dim)
        if L.q_norm is not None:                   # qwen3: each head normed
            q = rmsnorm(q, L.q_norm, cfg.eps)
            k = rmsnorm(k, L.k_norm, cfg.eps)
        q = rope(q, positions, cfg, model.rope_mode, None if win else freqs, base,
                 1.0 if win else mscale)
        k = rope(k, positions, cfg, model.rope_mode, None if win else freqs, base,
                 1.0 if win else mscale)
        cache.k[l, p0:p0 + T] = cache.round(k)
        cache.v[l, p0:p0 + T] = cache.round(v)
        keys = cache.k[l, :p0 + T]                 # [S, n_kv_heads, head_dim]
        vals = cache.v[l, :p0 + T]
        att_out = np.empty((T, cfg.n_heads, cfg.head_dim))
        for hd in range(cfg.n_heads):
            kv = hd // group
            scores = (q[:, hd, :] @ keys[:, kv, :].T) * scale   # [T, S]
            scores[lmask] = -np.inf
            att_out[:, hd, :] = softmax(scores) @ vals[:, kv, :]
        a = att_out.reshape(T, -1) @ L.wo.T
        x = x + (rmsnorm(a, L.post_attn_norm, cfg.eps) if gemma else a)
        # feed-forward (SwiGLU; gemma3: GELU-gated, then normed)
        h = rmsnorm(x, L.ffn_norm, cfg.eps)
        act = gelu_tanh if gemma else silu
        f = (act(h @ L.w_gate.T) * (h @ L.w_up.T)) @ L.w_down.T
        x = x + (rmsnorm(f, L.post_ffn_norm, cfg.eps) if gemma else f)
    cache.n = p0 + T
    x = rmsnorm(x, model.out_norm, cfg.eps)
    return x @ model.w_out.T


def forward(model, tokens, kv_dtype="f32"):
    """Full-sequence causal forward: logits [len(tokens), vocab], float64."""
    return forward_chunk(model, KVCache(model.cfg, len(tokens), kv_dtype), tokens)


def generate(model, prompt, n_steps):
    """Greedy decoding with an incremental KV cache.

    Returns (logits at the last prompt position, the n_steps generated ids, and
    per step the logits ids[i] was chosen from; step_logits[0] is logits_last)."""
    if len(prompt) == 0:
        raise ValueError("empty prompt")
    cache = KVCache(model.cfg, len(prompt) + n_steps)
    logits = forward_chunk(model, cache, prompt)[-1]
    ids, step_logits = [], []
    for step in range(n_steps):
        step_logits.append(logits)
        nxt = int(np.argmax(logits))
        ids.append(nxt)
        if step + 1 < n_steps:
            logits = forward_chunk(model, cache, [nxt])[-1]
    first = step_logits[0] if step_logits else logits
    return first, ids, step_logits


def top2_margin(logits):
    """Gap between the best and the second-best logit: how safe an argmax is."""
    a, b = np.partition(logits, -2)[-2:]
    return float(b - a)


def greedy(model, prompt_tokens, n_steps):
    """The n_steps ids greedy decoding produces after the prompt."""
    return generate(model, prompt_tokens, n_steps)[1]


# --------------------------------------------------------------------------
# Tokenizer (only to make prompts and to show text; the forward pass needs none)


def bytes_to_unicode():
    """GPT-2's byte -> printable character map used by byte-level BPE vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


class Vocab:
    def __init__(self, path):
        r = gguf.GGUFReader(path)
        self.tokens = [str(s) for s in r.fields["tokenizer.ggml.tokens"].contents()]
        self.types = list(r.fields["tokenizer.ggml.token_type"].contents())
        self.merges = [str(s) for s in r.fields["tokenizer.ggml.merges"].contents()]
        self.pre = r.fields["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in r.fields else ""
        self.eos = int(r.fields["tokenizer.ggml.eos_token_id"].contents())
        self._byte_of = {c: b for b, c in bytes_to_unicode().items()}
        self._hf = None

    def decode(self, ids):
        """Byte-level decoding; control tokens (token_type 3) print as themselves."""
        out = bytearray()
        for i in ids:
            s = self.tokens[i]
            if self.types[i] == 3 or any(ch not in self._byte_of for ch in s):
                out += s.encode("utf-8")
            else:
                out += bytes(self._byte_of[ch] for ch in s)
        return out.decode("utf-8", errors="replace")

    def hf_tokenizer(self):
        """An HF `tokenizers` BPE built from the GGUF vocabulary and merges."""
        if self._hf is None:
            from tokenizers import Tokenizer, AddedToken, models, pre_tokenizers, decoders
            vocab = {s: i for i, s in enumerate(self.tokens)}
            merges = [tuple(m.split(" ", 1)) for m in self.merges]
            tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
            steps = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
            if self.pre in ("smollm", "starcoder", "qwen2", "refact", "codeshell"):
                # llama.cpp: "\p{N}" split first, so every digit is its own piece
                steps.insert(0, pre_tokenizers.Digits(individual_digits=True))
            tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
            tok.decoder = decoders.ByteLevel()
            tok.add_special_tokens([AddedToken(s, special=True, normalized=False)
                                    for s, t in zip(self.tokens, self.types) if t == 3])
            self._hf = tok
        return self._hf

    def encode(self, text):
        return self.hf_tokenizer().encode(text, add_special_tokens=False).ids


def chat_prompt(user, system="You are a helpful AI assistant named SmolLM, trained by Hugging Face"):
    """SmolLM2's chat template (tokenizer.chat_template) with add_generation_prompt."""
    return (f"<|im_start|>system\n{system}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


# --------------------------------------------------------------------------
# Self-check: what can be checked without the C side


def _own_dequant(t):
    """Q8_0 / Q4_1 / F32 decoded straight from the ggml block layout, without gguf.quants."""
    raw = np.asarray(t.data).reshape(-1).view(np.uint8)
    if t.tensor_type == gguf.GGMLQuantizationType.F32:
        return raw.view(np.float32).copy()
    if t.tensor_type == gguf.GGMLQuantizationType.Q8_0:   # {f16 d; int8 q[32]}: x = d*q
        b = raw.reshape(-1, 34)
        d = b[:, :2].copy().view(np.float16).astype(np.float32)
        q = b[:, 2:].view(np.int8).astype(np.float32)
        return (d * q).reshape(-1)
    if t.tensor_type == gguf.GGMLQuantizationType.Q4_1:   # {f16 d, m; u8 qs[16]}: x = d*q + m
        b = raw.reshape(-1, 20)
        d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
        m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
        qs = b[:, 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # low nibbles = x[0..15]
        return (d * q + m).reshape(-1)
    raise NotImplementedError(t.tensor_type.name)


def selfcheck(path, text="The capital of France is", steps=8):
    ok = True

    def report(cond, what):
        nonlocal ok
        ok &= bool(cond)
        print(f"  [{'ok' if cond else 'FAIL'}] {what}")

    t0 = time.time()
    m = load(path)
    print(f"loaded {path} in {time.time() - t0:.1f}s: {m.cfg}, tied={m.tied}")
    voc = Vocab(path)

    print("dequantization: gguf.quants vs. a decoder written from the ggml block layout")
    reader = gguf.GGUFReader(path)
    byname = {t.name: t for t in reader.tensors}
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight",
                 "output_norm.weight"):
        t = byname[name]
        a = tensor_to_array(t)
        b = _own_dequant(t).reshape(a.shape)
        report(np.array_equal(a, b), f"{name} {t.tensor_type.name} ne={[int(n) for n in t.shape]}"
               f" -> array {a.shape}")
    # shape convention: an embedding row must be a token's vector, and
    # y = W @ x must be the way matrices apply (else shapes would not chain)
    report(m.tok_embd.shape == (m.cfg.vocab, m.cfg.dim), "token_embd is [vocab, dim]")

    print("tokenizer built from the GGUF vocab + merges")
    ids = voc.encode(text)
    print(f"  {text!r} -> {ids}")
    report(voc.decode(ids) == text, "decode(encode(text)) == text")
    chat = voc.encode(chat_prompt("What is 12+7?"))
    report(chat[0] == voc.tokens.index("<|im_start|>") and voc.decode(chat) == chat_prompt("What is 12+7?"),
           "chat-formatted text round-trips, <|im_start|> is one token")

    print("greedy continuation")
    t0 = time.time()
    out = greedy(m, ids, steps)
    dt = time.time() - t0
    cont = voc.decode(out)
    print(f"  {text!r} + {cont!r}   ids={out}   ({dt:.2f}s, {steps} steps)")
    report(cont.startswith(" Paris"), "continuation starts with ' Paris'")

    print("incremental KV cache vs. full-sequence forward")
    seq = ids + out
    full = forward(m, seq)
    cache = KVCache(m.cfg, len(seq))
    inc = [forward_chunk(m, cache, ids)]
    for tkn in out:
        inc.append(forward_chunk(m, cache, [tkn]))
    inc = np.concatenate(inc)
    err = np.max(np.abs(inc - full)) / np.max(np.abs(full))
    report(err < 1e-10, f"max rel diff {err:.2e}")
    report(all(int(np.argmax(full[len(ids) - 1 + i])) == out[i] for i in range(steps)),
           "full forward argmax reproduces the greedy ids")

    print("rope mode: 'norm' (adjacent pairs) vs. 'neox' (halves): mean NLL of natural text")
    sample = ("The quick brown fox jumps over the lazy dog. Paris is the capital and most "
              "populous city of France, with an estimated population of two million residents.")
    sid = voc.encode(sample)
    nll = {}
    for mode in ("norm", "neox"):
        m.rope_mode = mode
        lg = forward(m, sid)[:-1]
        lg = lg - lg.max(axis=1, keepdims=True)
        logp = lg - np.log(np.exp(lg).sum(axis=1, keepdims=True))
        nll[mode] = float(-np.mean(logp[np.arange(len(sid) - 1), sid[1:]]))
        print(f"  {mode}: {nll[mode]:.3f} nats/token over {len(sid) - 1} tokens")
    m.rope_mode = "norm"
    report(nll["norm"] < nll["neox"], "adjacent-pair rope fits the GGUF weights better")

    print("selfcheck", "PASSED" if ok else "FAILED")
    return ok


# --------------------------------------------------------------------------
# CLI


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                    "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--tokens", help="comma-separated prompt token ids")
    g.add_argument("--text", help="prompt text, tokenized with the GGUF vocabulary")
    g.add_argument("--selfcheck", action="store_true", help="check the reference itself")
    ap.add_argument("--chat", action="store_true", help="wrap --text in the chat template")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--out", help="write the JSON here instead of stdout")
    a = ap.parse_args(argv)

    if a.selfcheck:
        return 0 if selfcheck(a.model) else 1
    if a.text is not None:
        voc = Vocab(a.model)
        tokens = voc.encode(chat_prompt(a.text) if a.chat else a.text)
    else:
        tokens = [int(s) for s in a.tokens.split(",") if s.strip()]
    m = load(a.model)
    first, ids, _ = generate(m, tokens, a.steps)
    res = {"logits_last": [float(v) for v in first], "greedy": ids}
    if a.text is not None:
        res["prompt_tokens"] = tokens
        res["text"] = Vocab(a.model).decode(ids)
    s = json.dumps(res)
    if a.out:
        with open(a.out, "w") as f:
            f.write(s + "\n")
    else:
        print(s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
