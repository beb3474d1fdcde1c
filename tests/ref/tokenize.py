"""tokenize.py - reference tokenizers built from a GGUF file's vocabulary by third-party packages.

spm_from_gguf(path)   tokenizer.ggml.model == "llama": a sentencepiece BPE ModelProto assembled from
                      tokenizer.ggml.tokens / scores / token_type (byte fallback, dummy "▁" prefix),
                      loaded into sentencepiece.SentencePieceProcessor.
bpe_from_gguf(path)   tokenizer.ggml.model == "gpt2": a `tokenizers` byte-level BPE from
                      tokenizer.ggml.tokens / merges, control tokens added as special tokens. The
                      pre-tokenizer is the one for tokenizer.ggml.pre == "smollm" (and GPT-2 style
                      vocabularies generally): single digits split off, then the GPT-2 regex.

Both are only used to obtain prompt ids (and to decode the reference's output for a human); the
ids the tests use are hard-coded next to the text they came from.
"""
import gguf


def _fields(path):
    r = gguf.GGUFReader(path)
    get = lambda k, d=None: r.fields[k].contents() if k in r.fields else d
    return get


def spm_from_gguf(path):
    """A sentencepiece.SentencePieceProcessor equivalent to the GGUF's llama (SPM) vocabulary."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    get = _fields(path)
    if get("tokenizer.ggml.model") != "llama":
        raise ValueError("spm_from_gguf: not a SentencePiece (llama) vocabulary")
    tokens = get("tokenizer.ggml.tokens")
    scores = get("tokenizer.ggml.scores")
    types = get("tokenizer.ggml.token_type")
    m = pb.ModelProto()
    # GGUF token types use sentencepiece's numbering: 1 normal, 2 unknown, 3 control,
    # 4 user defined, 5 unused, 6 byte.
    for tok, sc, ty in zip(tokens, scores, types):
        p = m.pieces.add()
        p.piece = tok
        p.score = float(sc)
        p.type = int(ty)
    ts = m.trainer_spec
    ts.model_type = pb.TrainerSpec.BPE
    ts.vocab_size = len(tokens)
    ts.byte_fallback = True
    ts.unk_id = int(get("tokenizer.ggml.unknown_token_id", 0))
    ts.bos_id = int(get("tokenizer.ggml.bos_token_id", 1))
    ts.eos_id = int(get("tokenizer.ggml.eos_token_id", 2))
    ts.pad_id = -1
    ns = m.normalizer_spec
    ns.name = "identity"
    ns.add_dummy_prefix = bool(get("tokenizer.ggml.add_space_prefix", True))
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    return sp


def bpe_from_gguf(path):
    """A tokenizers.Tokenizer equivalent to the GGUF's GPT-2-style byte-level BPE vocabulary."""
    from tokenizers import Tokenizer, AddedToken, models, pre_tokenizers, decoders

    get = _fields(path)
    if get("tokenizer.ggml.model") != "gpt2":
        raise ValueError("bpe_from_gguf: not a byte-level BPE (gpt2) vocabulary")
    tokens = get("tokenizer.ggml.tokens")
    types = get("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tk.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False)
                for t, ty in zip(tokens, types) if int(ty) == 3]
    tk.add_special_tokens(specials)
    return tk
