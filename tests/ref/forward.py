"""forward.py - a NumPy reference forward pass for GGUF llama / qwen2 / qwen3 models.

Written from the formulas (RMSNorm, RoPE, grouped-query causal attention, SwiGLU), not from
engine code. Tensors are read with gguf.GGUFReader and dequantized to float32 with
gguf.quants.dequantize; every activation is float32. Dot products are accumulated however numpy's
BLAS does it: this reference pins down the formulas, not the rounding.

Usage:
    m = Model(path)
    logits = m.forward([1, 2, 3], start_pos=0)      # (3, vocab) float32, one row per token
    ids, step_logits = greedy(m, prompt_ids, n)     # n greedy tokens and the logits behind each

Layout conventions (GGUF / ggml): a 2-D weight of ggml shape [n_in, n_out] is read by numpy as an
(n_out, n_in) array W, and a layer computes y = x @ W.T.

RoPE (the part that is easy to get wrong):
  * llama: llama.cpp's convert script permutes the Q/K weights of HF checkpoints so that GGUF llama
    files rotate ADJACENT pairs (x[2i], x[2i+1]) -- the original Meta / GPT-J ("normal") form.
  * qwen2 / qwen3: NeoX form, pairs (x[i], x[i + d/2]).
  Pair i (0 <= i < d/2, d = rope.dimension_count) rotates by angle pos * base^(-2i/d), divided by
  rope_freqs[i] when the file has a "rope_freqs.weight" tensor (Llama 3.1 frequency factors).
  Dimensions of a head beyond d are left unrotated.
"""
import numpy as np
import gguf

ARCHS = ("llama", "qwen2", "qwen3")
NEOX_ARCHS = ("qwen2", "qwen3")


def _field(reader, key, default=None):
    """The value of metadata key, or default when absent."""
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


def _dequant(t):
    """float32 numpy array of a GGUF tensor, shaped (ggml ne[n-1], ..., ne[0])."""
    if t.tensor_type == gguf.GGMLQuantizationType.F32:
        a = np.asarray(t.data, dtype=np.float32)
    else:
        a = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    shape = tuple(int(x) for x in reversed(t.shape))
    return np.ascontiguousarray(a.reshape(shape))


def rms_norm(x, w, eps):
    """RMSNorm over the last axis: x / sqrt(mean(x^2) + eps) * w, all float32."""
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    return (x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps)))) * w


def silu(x):
    return x / (np.float32(1.0) + np.exp(-x))


def q8_round_trip(x):
    """x with every block of 32 along the last axis rounded like ggml's quantize_row_q8_0:
    d = amax / 127 (stored as fp16), q = round-half-away(x / d), value q * fp16(d)."""
    shp = x.shape
    if shp[-1] % 32:
        return x
    b = x.reshape(-1, 32).astype(np.float32)
    amax = np.max(np.abs(b), axis=1, keepdims=True)
    d = amax / np.float32(127.0)
    inv = np.where(d > 0, np.float32(1.0) / np.where(d > 0, d, 1), np.float32(0.0))
    v = b * inv
    q = np.clip(np.sign(v) * np.floor(np.abs(v) + np.float32(0.5)), -127, 127)
    return (q * d.astype(np.float16).astype(np.float32)).reshape(shp).astype(np.float32)


def softmax(x):
    m = np.max(x, axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / np.sum(e, axis=-1, keepdims=True)


class Model:
    """A whole model in memory as float32 arrays, with a KV cache for incremental decoding.

    forward(tokens, start_pos) writes the tokens' keys/values at positions start_pos.. and
    discards anything cached beyond them, so rewinding (start_pos < cached length) is allowed.
    """

    def __init__(self, path, n_ctx=None, act_quant=None):
        """Load every tensor of the GGUF at path as float32.

        act_quant=None (default) keeps activations float32. act_quant="q8" rounds the input of
        every weight matmul to 8-bit blocks of 32 with an fp16 scale (ggml's Q8_0 / Q8_1 rule,
        the one int8 dot-product kernels use); it exists only to estimate how far an engine
        that does so may stray from the float reference."""
        if act_quant not in (None, "q8"):
            raise ValueError(f"act_quant must be None or 'q8', not {act_quant!r}")
        self.act_quant = act_quant
        r = gguf.GGUFReader(path)
        arch = _field(r, "general.architecture")
        if arch not in ARCHS:
            raise ValueError(f"reference: unsupported architecture {arch!r}")
        self.arch = arch
        g = lambda k, d=None: _field(r, f"{arch}.{k}", d)
        self.n_layer = int(g("block_count"))
        self.n_embd = int(g("embedding_length"))
        self.n_head = int(g("attention.head_count"))
        self.n_head_kv = int(g("attention.head_count_kv", self.n_head))
        self.head_dim = int(g("attention.key_length", self.n_embd // self.n_head))
        self.head_dim_v = int(g("attention.value_length", self.head_dim))
        self.eps = float(g("attention.layer_norm_rms_epsilon", 1e-5))
        self.rope_base = float(g("rope.freq_base", 10000.0))
        self.rope_dim = int(g("rope.dimension_count", self.head_dim))
        self.n_ctx_train = int(g("context_length", 2048))
        self.n_ctx = int(n_ctx or self.n_ctx_train)
        self.neox = arch in NEOX_ARCHS
        self.bos = _field(r, "tokenizer.ggml.bos_token_id")
        self.eos = _field(r, "tokenizer.ggml.eos_token_id")

        tensors = {t.name: t for t in r.tensors}
        W = lambda name: _dequant(tensors[name])
        opt = lambda name: _dequant(tensors[name]) if name in tensors else None

        self.tok_embd = W("token_embd.weight")                    # (vocab, n_embd)
        self.vocab = self.tok_embd.shape[0]
        self.out_norm = W("output_norm.weight")                   # (n_embd,)
        # tied output head: reuse the embedding when output.weight is absent
        self.output = opt("output.weight")                        # (vocab, n_embd)
        if self.output is None:
            self.output = self.tok_embd
        freq_factors = opt("rope_freqs.weight")                   # (rope_dim/2,) or None

        self.layers = []
        for i in range(self.n_layer):
            p = f"blk.{i}."
            L = {
                "attn_norm": W(p + "attn_norm.weight"),           # (n_embd,)
                "wq": W(p + "attn_q.weight"),                     # (n_head*hd, n_embd)
                "wk": W(p + "attn_k.weight"),                     # (n_head_kv*hd, n_embd)
                "wv": W(p + "attn_v.weight"),                     # (n_head_kv*hd_v, n_embd)
                "wo": W(p + "attn_output.weight"),                # (n_embd, n_head*hd_v)
                "bq": opt(p + "attn_q.bias"),                     # qwen2 only
                "bk": opt(p + "attn_k.bias"),
                "bv": opt(p + "attn_v.bias"),
                "q_norm": opt(p + "attn_q_norm.weight"),          # qwen3 only: (hd,)
                "k_norm": opt(p + "attn_k_norm.weight"),
                "ffn_norm": W(p + "ffn_norm.weight"),             # (n_embd,)
                "w_gate": W(p + "ffn_gate.weight"),               # (n_ff, n_embd)
                "w_up": W(p + "ffn_up.weight"),                   # (n_ff, n_embd)
                "w_down": W(p + "ffn_down.weight"),               # (n_embd, n_ff)
            }
            self.layers.append(L)
        if arch == "qwen3" and self.layers[0]["q_norm"] is None:
            raise ValueError("reference: qwen3 file without attn_q_norm.weight")

        # RoPE inverse frequencies, one per rotated pair, float32 like an engine would hold them.
        half = self.rope_dim // 2
        inv = self.rope_base ** (-2.0 * np.arange(half, dtype=np.float64) / self.rope_dim)
        if freq_factors is not None:
            inv = inv / freq_factors.astype(np.float64)
        self.inv_freq = inv                                        # (half,) float64
        self.reset()

    def reset(self):
        """Forget the KV cache (capacity grows on demand, up to n_ctx positions)."""
        self.k_cache = [np.zeros((0, self.n_head_kv, self.head_dim), np.float32)
                        for _ in range(self.n_layer)]
        self.v_cache = [np.zeros((0, self.n_head_kv, self.head_dim_v), np.float32)
                        for _ in range(self.n_layer)]
        self.n_past = 0

    def _reserve(self, n_pos):
        """Make every layer's cache hold at least n_pos positions, keeping what it has."""
        cap = self.k_cache[0].shape[0]
        if n_pos <= cap:
            return
        new = min(self.n_ctx, max(n_pos, 2 * cap, 256))
        for il in range(self.n_layer):
            for c in (self.k_cache, self.v_cache):
                old = c[il]
                grown = np.zeros((new,) + old.shape[1:], np.float32)
                grown[:cap] = old
                c[il] = grown

    def _mm(self, x, w):
        """x @ w.T, with x rounded to 8-bit blocks first when act_quant is set."""
        if self.act_quant:
            x = q8_round_trip(x)
        return x @ w.T

    def _rope(self, x, pos):
        """Rotate x (n_tok, n_heads, hd) in place for positions pos (n_tok,)."""
        half = self.rope_dim // 2
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]  # (n_tok, half)
        cos = np.cos(ang).astype(np.float32)[:, None, :]
        sin = np.sin(ang).astype(np.float32)[:, None, :]
        if self.neox:
            a = x[..., :half].copy()
            b = x[..., half:self.rope_dim].copy()
            x[..., :half] = a * cos - b * sin
            x[..., half:self.rope_dim] = a * sin + b * cos
        else:
            a = x[..., 0:self.rope_dim:2].copy()
            b = x[..., 1:self.rope_dim:2].copy()
            x[..., 0:self.rope_dim:2] = a * cos - b * sin
            x[..., 1:self.rope_dim:2] = a * sin + b * cos
        return x

    def forward(self, tokens, start_pos):
        """Logits (len(tokens), vocab) float32 for tokens at positions start_pos, start_pos+1, ...

        Each token attends to every cached position before it and to itself (causal)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        n = len(tokens)
        if start_pos > self.n_past:
            raise ValueError(f"start_pos {start_pos} leaves a gap (cached {self.n_past})")
        if start_pos + n > self.n_ctx:
            raise ValueError(f"positions {start_pos}..{start_pos + n - 1} exceed context {self.n_ctx}")
        self._reserve(start_pos + n)
        hd, hdv, nh, nkv = self.head_dim, self.head_dim_v, self.n_head, self.n_head_kv
        group = nh // nkv
        pos = np.arange(start_pos, start_pos + n)
        end = start_pos + n
        scale = np.float32(1.0 / np.sqrt(hd))
        # causal mask for the new queries over keys 0..end-1
        mask = np.arange(end)[None, :] > pos[:, None]                    # (n, end)

        x = self.tok_embd[tokens].copy()                                 # (n, n_embd)
        for il, L in enumerate(self.layers):
            # attention rmsnorm
            h = rms_norm(x, L["attn_norm"], self.eps)
            # q, k, v projections (+ biases for qwen2)
            q = self._mm(h, L["wq"])
            k = self._mm(h, L["wk"])
            v = self._mm(h, L["wv"])
            if L["bq"] is not None:
                q = q + L["bq"]
                k = k + L["bk"]
                v = v + L["bv"]
            q = q.reshape(n, nh, hd)
            k = k.reshape(n, nkv, hd)
            v = v.reshape(n, nkv, hdv)
            # qwen3: per-head RMSNorm of q and k before rope
            if L["q_norm"] is not None:
                q = rms_norm(q, L["q_norm"], self.eps)
                k = rms_norm(k, L["k_norm"], self.eps)
            q = self._rope(np.ascontiguousarray(q, dtype=np.float32), pos)
            k = self._rope(np.ascontiguousarray(k, dtype=np.float32), pos)
            # store in the KV cache
            self.k_cache[il][start_pos:end] = k
            self.v_cache[il][start_pos:end] = v
            K = self.k_cache[il][:end]                                   # (end, nkv, hd)
            V = self.v_cache[il][:end]                                   # (end, nkv, hdv)
            # grouped-query attention: query head j uses kv head j // group
            qg = q.reshape(n, nkv, group, hd).transpose(1, 2, 0, 3)      # (nkv, group, n, hd)
            Kt = K.transpose(1, 2, 0)[:, None, :, :]                     # (nkv, 1, hd, end)
            s = (qg @ Kt) * scale                                        # (nkv, group, n, end)
            s = np.where(mask[None, None], np.float32(-np.inf), s)
            p = softmax(s).astype(np.float32)
            o = p @ V.transpose(1, 0, 2)[:, None, :, :]                  # (nkv, group, n, hdv)
            o = o.transpose(2, 0, 1, 3).reshape(n, nh * hdv)
            # output projection and residual
            x = x + self._mm(o, L["wo"])
            # ffn rmsnorm, SwiGLU, residual
            h = rms_norm(x, L["ffn_norm"], self.eps)
            gate = self._mm(h, L["w_gate"])
            up = self._mm(h, L["w_up"])
            x = x + self._mm(silu(gate) * up, L["w_down"])
        self.n_past = end
        # final norm and output head
        x = rms_norm(x, self.out_norm, self.eps)
        return self._mm(x, self.output).astype(np.float32, copy=False)


def greedy(model, prompt_ids, n, stop_at_eos=False):
    """Greedy decoding: returns (ids, logits) with ids the n generated tokens (prompt excluded)
    and logits an (n, vocab) float32 array, row i the logits that chose ids[i].

    The prompt is evaluated in one batch, then one token per step through the KV cache."""
    model.reset()
    out_ids, out_logits = [], []
    logits = model.forward(prompt_ids, 0)[-1]
    pos = len(prompt_ids)
    for _ in range(n):
        t = int(np.argmax(logits))
        out_ids.append(t)
        out_logits.append(logits)
        if stop_at_eos and t == model.eos:
            break
        if len(out_ids) == n:
            break
        logits = model.forward([t], pos)[-1]
        pos += 1
    return out_ids, np.stack(out_logits).astype(np.float32)


def top2_margin(logits):
    """Difference between the largest and second-largest logit of a 1-D vector."""
    a = np.partition(logits, -2)[-2:]
    return float(a[1] - a[0])
