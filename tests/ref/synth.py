"""synth.py - tiny GGUF models with random F32 weights, written with gguf.GGUFWriter.

write_model(path, arch, ...) writes a complete, loadable model of architecture "llama", "qwen2" or
"qwen3" (or any other name, for error tests: the hyper-parameters are then written under that
name's prefix), with the optional features each family has:
  llama  GQA, tied output (no output.weight), optional rope_freqs.weight (Llama 3.1 factors)
  qwen2  Q/K/V biases, separate output.weight
  qwen3  per-head attn_q_norm / attn_k_norm, head size (attention.key_length) != width / heads
The vocabulary is a SentencePiece-style one (tokenizer.ggml.model = "llama": <unk>, <s>, </s>, the
256 byte tokens <0x00>..<0xFF>, then pieces) for llama, and a GPT-2 byte-level BPE one for qwen2 and
qwen3, so a loader that insists on a tokenizer finds one.

These files are independent of the engine's own `synth` command: the reference and the engine
both read them, and the tests compare the two.
"""
import numpy as np
import gguf

F32 = np.float32


def _bytes_to_unicode():
    """GPT-2's reversible map from bytes to printable unicode characters."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def _spm_vocab(n_vocab):
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    letters = "abcdefghijklmnopqrstuvwxyz"
    i = 0
    while len(toks) < n_vocab:
        a, b = letters[i % 26], letters[(i // 26) % 26]
        piece = "▁" + a if i < 26 else a + b
        if piece not in toks:
            toks.append(piece)
            types.append(1)
        i += 1
    scores = [0.0] * 259 + [-float(k) for k in range(len(toks) - 259)]
    return toks, scores, types


def _bpe_vocab(n_vocab):
    b2u = _bytes_to_unicode()
    toks = [b2u[b] for b in range(256)]
    merges = []
    letters = "abcdefghijklmnopqrstuvwxyz"
    sp = b2u[ord(" ")]
    for i in range(n_vocab - 256 - 2):
        a, b = (sp, letters[i % 26]) if i < 26 else (letters[i % 26], letters[(i // 26) % 26])
        if a + b in toks:
            continue
        toks.append(a + b)
        merges.append(f"{a} {b}")
    toks += ["<|endoftext|>", "<|im_start|>"]
    types = [1] * (len(toks) - 2) + [3, 3]
    return toks, types, merges


def write_model(path, arch="llama", n_layer=2, n_embd=64, n_head=4, n_head_kv=2, head_dim=None,
                n_ff=96, n_vocab=320, n_ctx=256, rope_base=10000.0, rope_freqs=False,
                tied=None, eps=1e-5, seed=0, weight_scale=1.0, embd_scale=1.0):
    """Write a random model to path; returns the path.

    head_dim defaults to n_embd // n_head; tied defaults to True for llama, False otherwise.
    Weights are N(0, 1/n_in) * weight_scale so activations and logits stay O(1)."""
    rng = np.random.default_rng(seed)
    hd = head_dim or n_embd // n_head
    if tied is None:
        tied = arch == "llama"
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"synthetic-{arch}")
    w.add_context_length(n_ctx)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    if head_dim is not None:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(eps)
    w.add_vocab_size(n_vocab)
    w.add_file_type(0)  # all F32
    if arch == "llama":
        toks, scores, types = _spm_vocab(n_vocab)
        w.add_tokenizer_model("llama")
        w.add_token_list(toks)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
    else:
        toks, types, merges = _bpe_vocab(n_vocab)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(toks)
        w.add_token_types(types)
        w.add_token_merges(merges)
        w.add_bos_token_id(n_vocab - 2)
        w.add_eos_token_id(n_vocab - 2)
        w.add_add_bos_token(False)

    def mat(n_out, n_in):  # numpy (n_out, n_in) == ggml [n_in, n_out]
        return (rng.standard_normal((n_out, n_in)) * (weight_scale / np.sqrt(n_in))).astype(F32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(F32)

    w.add_tensor("token_embd.weight", (embd_scale * rng.standard_normal((n_vocab, n_embd))).astype(F32))
    w.add_tensor("output_norm.weight", norm(n_embd))
    if not tied:
        w.add_tensor("output.weight", mat(n_vocab, n_embd))
    if rope_freqs:
        # Llama 3.1-like factors: 1 for the fastest-turning pairs, growing to 8 for the slowest
        ff = np.interp(np.arange(hd // 2), [0, hd // 4, hd // 2 - 1], [1.0, 1.0, 8.0]).astype(F32)
        w.add_tensor("rope_freqs.weight", ff)
    for i in range(n_layer):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm(n_embd))
        w.add_tensor(p + "attn_q.weight", mat(n_head * hd, n_embd))
        w.add_tensor(p + "attn_k.weight", mat(n_head_kv * hd, n_embd))
        w.add_tensor(p + "attn_v.weight", mat(n_head_kv * hd, n_embd))
        if arch == "qwen2":
            w.add_tensor(p + "attn_q.bias", (0.5 * rng.standard_normal(n_head * hd)).astype(F32))
            w.add_tensor(p + "attn_k.bias", (0.5 * rng.standard_normal(n_head_kv * hd)).astype(F32))
            w.add_tensor(p + "attn_v.bias", (0.5 * rng.standard_normal(n_head_kv * hd)).astype(F32))
        if arch == "qwen3":
            w.add_tensor(p + "attn_q_norm.weight", norm(hd))
            w.add_tensor(p + "attn_k_norm.weight", norm(hd))
        w.add_tensor(p + "attn_output.weight", mat(n_embd, n_head * hd))
        w.add_tensor(p + "ffn_norm.weight", norm(n_embd))
        w.add_tensor(p + "ffn_gate.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_up.weight", mat(n_ff, n_embd))
        w.add_tensor(p + "ffn_down.weight", mat(n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
