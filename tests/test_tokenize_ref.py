"""test_tokenize_ref.py - pipeshard's tokenizers against independent references.

(a) SmolLM2-135M-Instruct (gpt2 / smollm): the ids of pipeshard's byte-level BPE must equal those
    of a Hugging Face `tokenizers.Tokenizer` assembled here from the GGUF vocabulary and merges
    with the pre-tokenizer of SmolLM2's tokenizer.json (Digits(individual_digits) + ByteLevel);
    the control tokens are added as special tokens.
(b) stories260K (llama / SentencePiece): the ids must equal those of a real
    `sentencepiece.SentencePieceProcessor` loaded from a ModelProto assembled here from the GGUF
    pieces, scores and types (BPE, identity normalizer, dummy prefix, byte fallback).
(c) decode(encode(s)) == s for both, the references decode our ids to s too, and the streaming
    detokenizer hands out the same bytes without ever cutting a UTF-8 character.
(a') the same vocabulary and merges re-labelled with the llama-bpe (Llama 3), qwen2 and gpt-2
    pre-tokenizers, written as GGUF files here, against HF with the pre-tokenizer sections of
    those models' tokenizer.json files (the original regexes, run by HF's Oniguruma).
(d) a synthetic SentencePiece vocabulary written here as a GGUF file (with user-defined and
    unused pieces, which stories260K lacks), against sentencepiece the same way; no model needed.
(e) the vocabulary `pipeshard synth` writes, under the smollm, llama-bpe (Llama 3) and qwen2
    pre-tokenizers (synth --like smollm2-135m / llama-3.2-1b / qwen2.5-1.5b, shrunk), against HF
    as in (a'); no model needed.
Every part runs over FIXED, EDGE (issue 17: contractions before capitals and in all-caps words,
every Unicode White_Space and line-break character, lone CR, combining marks, digits next to
letters in many scripts) and a few hundred random strings from those classes (fixed seeds).

The C library is reached through ctypes on $PS_LIBPSCORE. Parts (a) and (b) are skipped (with a
message) when their model file is absent; the test then exits 77 (skipped) if all else passed.
"""
import ctypes
import os
import random
import subprocess
import sys

import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pstest import require  # noqa: E402

PS_TOK_DECODE_SPECIAL = 1
PS_TOK_DECODE_STRIP_SPACE = 2
PS_ERR_RANGE = 6


# ---------------------------------------------------------------- the C tokenizer


class CTok:
    """A ps_tok behind ctypes."""

    def __init__(self, lib, path):
        self.lib = lib
        self.tok = ctypes.c_void_p()
        err = ctypes.create_string_buffer(512)
        rc = lib.ps_tok_create_from_file(path.encode(), ctypes.byref(self.tok), err, len(err))
        if rc != 0:
            raise RuntimeError(f"ps_tok_create_from_file({path}) = {rc}: {err.value.decode()}")

    def close(self):
        self.lib.ps_tok_free(self.tok)

    def encode(self, text, add_special=False, parse_special=False):
        data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
        n = ctypes.c_size_t()
        cap = len(data) + 8
        ids = (ctypes.c_int32 * cap)()
        err = ctypes.create_string_buffer(256)
        rc = self.lib.ps_tok_encode(self.tok, data, len(data), add_special, parse_special, ids, cap,
                                    ctypes.byref(n), err, len(err))
        if rc == PS_ERR_RANGE:  # more ids than bytes + 8: ask again with the size it said
            cap = n.value
            ids = (ctypes.c_int32 * cap)()
            rc = self.lib.ps_tok_encode(self.tok, data, len(data), add_special, parse_special, ids, cap,
                                        ctypes.byref(n), err, len(err))
        if rc != 0:
            raise RuntimeError(f"ps_tok_encode = {rc}: {err.value.decode()}")
        return list(ids[: n.value])

    def decode(self, ids, flags=0):
        arr = (ctypes.c_int32 * max(1, len(ids)))(*ids)
        n = ctypes.c_size_t()
        err = ctypes.create_string_buffer(256)
        cap = 16 * len(ids) + 16
        out = ctypes.create_string_buffer(cap)
        rc = self.lib.ps_tok_decode(self.tok, arr, len(ids), flags, out, cap, ctypes.byref(n), err, len(err))
        if rc == PS_ERR_RANGE:
            cap = n.value
            out = ctypes.create_string_buffer(cap)
            rc = self.lib.ps_tok_decode(self.tok, arr, len(ids), flags, out, cap, ctypes.byref(n), err, len(err))
        if rc != 0:
            raise RuntimeError(f"ps_tok_decode = {rc}: {err.value.decode()}")
        return out.raw[: n.value]

    def stream(self, ids, flags=0):
        """The chunks the streaming detokenizer hands out, the final flush last."""
        s = ctypes.c_void_p()
        require(self.lib.ps_tok_stream_create(self.tok, flags, ctypes.byref(s)) == 0, "ps_tok_stream_create failed")
        p = ctypes.POINTER(ctypes.c_char)()
        n = ctypes.c_size_t()
        chunks = []
        for i in ids:
            require(self.lib.ps_tok_stream_push(s, i, ctypes.byref(p), ctypes.byref(n)) == 0,
                    lambda: f"ps_tok_stream_push({i}) failed")
            chunks.append(ctypes.string_at(p, n.value))
        self.lib.ps_tok_stream_flush(s, ctypes.byref(p), ctypes.byref(n))
        chunks.append(ctypes.string_at(p, n.value))
        self.lib.ps_tok_stream_free(s)
        return chunks


def load_lib():
    path = os.environ.get("PS_LIBPSCORE")
    if not path or not os.path.exists(path):
        print(f"PS_LIBPSCORE ({path}) is not a file: build pscore_shared first")
        sys.exit(1)
    lib = ctypes.CDLL(path)
    vp, sz, i32p = ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int32)
    lib.ps_tok_create_from_file.argtypes = [ctypes.c_char_p, ctypes.POINTER(vp), ctypes.c_char_p, sz]
    lib.ps_tok_free.argtypes = [vp]
    lib.ps_tok_encode.argtypes = [vp, ctypes.c_char_p, sz, ctypes.c_bool, ctypes.c_bool, i32p, sz,
                                  ctypes.POINTER(sz), ctypes.c_char_p, sz]
    lib.ps_tok_decode.argtypes = [vp, i32p, sz, ctypes.c_uint, ctypes.c_char_p, sz, ctypes.POINTER(sz),
                                  ctypes.c_char_p, sz]
    lib.ps_tok_stream_create.argtypes = [vp, ctypes.c_uint, ctypes.POINTER(vp)]
    lib.ps_tok_stream_free.argtypes = [vp]
    lib.ps_tok_stream_push.argtypes = [vp, ctypes.c_int32, ctypes.POINTER(ctypes.POINTER(ctypes.c_char)),
                                       ctypes.POINTER(sz)]
    lib.ps_tok_stream_flush.argtypes = [vp, ctypes.POINTER(ctypes.POINTER(ctypes.c_char)), ctypes.POINTER(sz)]
    return lib


# ---------------------------------------------------------------- references


_FIELDS = {}


def gguf_fields(path):
    """A getter over the file's tokenizer.* metadata (read once per file: GGUFReader is slow)."""
    if path not in _FIELDS:
        r = gguf.GGUFReader(path)
        _FIELDS[path] = {k: f.contents() for k, f in r.fields.items() if k.startswith("tokenizer.")}
    fields = _FIELDS[path]
    return lambda k, d=None: fields.get(k, d)


def hf_smollm(path):
    """SmolLM2's tokenizer as HF tokenizers runs it, from the GGUF metadata alone."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    get = gguf_fields(path)
    require(get("tokenizer.ggml.model") == "gpt2" and get("tokenizer.ggml.pre") == "smollm",
            lambda: f"{path}: not a gpt2/smollm vocabulary")
    tokens = get("tokenizer.ggml.tokens")
    types = get("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges")]
    tk = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    # SmolLM2's tokenizer.json: {"type": "Sequence", "pretokenizers": [{"type": "Digits",
    # "individual_digits": true}, {"type": "ByteLevel", "add_prefix_space": false,
    # "trim_offsets": true, "use_regex": true}]}, decoder ByteLevel, no normalizer.
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    tk.decoder = decoders.ByteLevel()
    specials = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3]
    tk.add_special_tokens(specials)
    return tk


def sp_stories(path):
    """A sentencepiece processor for the GGUF's llama vocabulary, configured as llama's."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    get = gguf_fields(path)
    require(get("tokenizer.ggml.model") == "llama", lambda: f"{path}: not a llama vocabulary")
    m = pb.ModelProto()
    for piece, score, ty in zip(get("tokenizer.ggml.tokens"), get("tokenizer.ggml.scores"),
                                get("tokenizer.ggml.token_type")):
        p = m.pieces.add()
        p.piece, p.score, p.type = piece, float(score), int(ty)  # GGUF uses sentencepiece's type numbers
    ts = m.trainer_spec
    ts.model_type = pb.TrainerSpec.BPE
    ts.vocab_size = len(m.pieces)
    ts.byte_fallback = True
    ts.unk_id, ts.bos_id, ts.eos_id, ts.pad_id = 0, 1, 2, -1
    ns = m.normalizer_spec
    ns.name = "identity"
    ns.add_dummy_prefix = True
    ns.remove_extra_whitespaces = False
    ns.escape_whitespaces = True
    ns.precompiled_charsmap = b""
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    return sp


# The "pre_tokenizer" regexes of Meta-Llama-3's and Qwen2's tokenizer.json, verbatim.
HF_LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
HF_QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")


def hf_variant(path, pre):
    """HF tokenizer over the GGUF's vocabulary with the pre-tokenizer of another model family."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    get = gguf_fields(path)
    tokens, types = get("tokenizer.ggml.tokens"), get("tokenizer.ggml.token_type")
    merges = [tuple(m.split(" ", 1)) for m in get("tokenizer.ggml.merges")]
    # Llama 3's tokenizer.json sets "ignore_merges": true
    tk = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, ignore_merges=(pre == "llama-bpe")))
    if pre == "gpt-2":
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        regex = HF_LLAMA3_RE if pre == "llama-bpe" else HF_QWEN2_RE
        tk.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ])
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
    return tk


def write_variant(src, pre, path):
    """A GGUF holding src's gpt2 vocabulary and merges under another tokenizer.ggml.pre."""
    get = gguf_fields(src)
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(get("tokenizer.ggml.tokens"))
    w.add_token_types(get("tokenizer.ggml.token_type"))
    w.add_token_merges(get("tokenizer.ggml.merges"))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)  # llama-bpe would add BOS by default; HF's encode here does not
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def synth_spm_vocab():
    """(pieces, scores, types) of a small SentencePiece BPE vocabulary with every token type."""
    pieces = [("<unk>", 0.0, 2), ("<s>", 0.0, 3), ("</s>", 0.0, 3)]
    pieces += [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
    pieces += [("<ud>", 0.0, 4), ("\u2581foo", 0.0, 4), ("xyz", 0.0, 4), ("<|sep|>", 0.0, 3)]
    merged = ["\u2581t", "th", "he", "\u2581th", "\u2581the", "in", "an", "er", "re", "on", "at", "en", "nd",
              "\u2581a", "\u2581s", "\u2581w", "ing", "ed", "es", "or", "\u2581an", "\u2581and", "ll", "\u2581he",
              "ou", "it", "\u2581i", "\u2581o", "ar", "is", "\u2581b", "\u2581c", "le", "\u2581f", "\u2581fo", "oo",
              "\u2581\u2581", "\u2581\u2581\u2581", "\u2581\u2581\u2581\u2581", "ab", "abc", "bc", "cd", "bcd"]
    unused = {"he", "ing", "bc", "\u2581\u2581\u2581", "ll"}
    for i, p in enumerate(merged):
        pieces.append((p, -float(i), 5 if p in unused else 1))
    chars = "\u2581abcdefghijklmnopqrstuvwxyzTHEIO.,!?'0123456789\n\u00e9\u00fc\u4e2d\u6587"
    for i, ch in enumerate(chars):
        pieces.append((ch, -100.0 - i, 1))
    return pieces


def write_synth_spm(path):
    w = gguf.GGUFWriter(path, "llama")
    pieces = synth_spm_vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list([p for p, _, _ in pieces])
    w.add_token_scores([sc for _, sc, _ in pieces])
    w.add_token_types([ty for _, _, ty in pieces])
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sp_from_pieces(pieces):
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    m = pb.ModelProto()
    for piece, score, ty in pieces:
        p = m.pieces.add()
        p.piece, p.score, p.type = piece, score, ty
    ts = m.trainer_spec
    ts.model_type = pb.TrainerSpec.BPE
    ts.vocab_size = len(m.pieces)
    ts.byte_fallback = True
    ts.unk_id, ts.bos_id, ts.eos_id, ts.pad_id = 0, 1, 2, -1
    ns = m.normalizer_spec
    ns.name, ns.add_dummy_prefix, ns.remove_extra_whitespaces, ns.escape_whitespaces = "identity", True, False, True
    sp = spm.SentencePieceProcessor()
    sp.LoadFromSerializedProto(m.SerializeToString())
    return sp


# ---------------------------------------------------------------- test strings

FIXED = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t\n  \t", "a", "Hello", "Hello world",
    " Hello world", "Hello world ", "  leading and trailing  ", "multiple   internal    spaces",
    "tabs\tand\nnewlines\r\nmixed", "line one\nline two\n\nline four\n", "trailing newline\n",
    "I'm sure they'll say it's fine, don't you think? We've seen it. I'd go.",
    "IT'S DON'T WE'LL YOU'RE THEY'VE I'M HE'D", "it'\u017f long s, I'\u212aelvin, 'LL 'Ll 'lL", "it’s curly ‘quotes’ and “double”",
    "Once upon a time, there was a little girl named Lily.",
    "The quick brown fox jumps over the lazy dog.", "Pack my box with five dozen liquor jugs!",
    "Café naïve résumé façade Ångström coöperate", "e\u0301 combining acute, a\u0308 umlaut, n\u0303",
    "Z\u0351\u0352\u0353a\u0330\u0331l\u0316g\u0317o\u0300\u0301", "ﬁ ﬂ ligatures, ＡＢＣ fullwidth １２３",
    "你好，世界！这是一个测试。", "日本語のテキストとカタカナ ー ひらがな", "한국어 텍스트입니다",
    "Россия и Україна, Беларусь", "Ελληνικά γράμματα αβγ ΑΒΓ", "مرحبا بالعالم", "שלום עולם",
    "नमस्ते दुनिया", "สวัสดีชาวโลก", "வணக்கம் உலகம்", "გამარჯობა მსოფლიო", "Բարեւ աշխարհ",
    "ሰላም ልዑል", "Xin chào thế giới", "Merhaba dünya, İstanbul ıI", "Zażółć gęślą jaźń",
    "Emoji: 😀👍🏽🇺🇸 and ❤️", "family 👨‍👩‍👧‍👦 zwj", "🤖🚀🔥💯 no spaces🎉", "keycap 1️⃣ #️⃣",
    "Numbers 12345 and 3.14159 and 1,000,000", "0", "00", "007", "1234567890", "2024-01-15T10:30:00Z",
    "+1 (555) 123-4567", "0x1F 0b1010 1e-9 6.02e23", "v1.2.3-rc4", "١٢٣ ٤٥٦ arabic-indic digits",
    "१२३ devanagari digits", "²³ superscripts ½ ¾ fractions", "Ⅻ roman ① circled", "$100.00 €50 £30 ¥2000",
    "Punctuation!!! ??? ... --- (parens) [brackets] {braces}", "a.b,c;d:e!f?g", "@#$%^&*()_+-=",
    "~`|\\/<>", "\"quoted\" 'single'", "....", "!!!???", "<<>>",
    "def foo(x):\n    return x ** 2  # square\n", "int main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}",
    '{"key": "value", "list": [1, 2, 3], "nested": {"a": null}}', "<html><body><p>Hi</p></body></html>",
    "SELECT * FROM users WHERE id = 42;", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "https://example.com/path?query=1&b=2#frag", "user.name+tag@example.co.uk",
    "    indented four\n        indented eight", "x = [i for i in range(10) if i % 2 == 0]",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n",
    "<|im_start|>", "<|im_end|><|im_end|>", "<|endoftext|>", "text<|endoftext|>more", "<|im_start",
    "|im_start|>", "<|im_start|> spaced <|im_end|>", "<s>", "</s>", "<unk>", "<s>Hello</s>", "<0x41>",
    "<repo_name>x<file_sep>y", "<|unknown_special|>", "nbsp\u00a0here\u00a0\u00a0twice", "ideographic\u3000space",
    "zero\u200bwidth\u200cjoiner\u200d", "\ufeffBOM at start", "rtl \u200f mark \u200e", "en\u2002em\u2003thin\u2009",
    "line\u2028sep\u2029para", "nel\x85here\x85\x85 end", "mongolian\u180evowel \u180e sep", "!\u180e?", "x\u180e\u180e!", "(\u0085)",
    "ctrl\x01\x02\x1b[0m", "file\x1c\x1cseparators\x1f", "\x7f del", "tab\t\tx", "a\u0085 \u0085", "  \u3000",
    "end with spaces   ", "   start with spaces", " \t mixed \t ", "\n\n\nthree newlines", "a\n\n\n\nb",
    "the other thing and the end", "and then he sang singing", "abcd bcd abc cd", "foo food  foo   foo",
    "x<ud>y", "<ud>", "<ud><ud> <ud>", "xyzxyz xyz", "thethethe", "hello well", " foo", "a <|sep|> b",
    "word" * 30, "a" * 200, " " * 50, "ab " * 40, "1" * 40, "😀" * 20, "。" * 10, "\n" * 12,
    "Ǆ ǅ ǆ titlecase", "ß ẞ straße", "İ i̇ dotted", "ǰ̌", "Ωmega ℃ №", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛", "𐍈 gothic",
]

ALPHABET = [
    "a", "b", "z", "Q", "e", "é", "ß", " ", " ", " ", "  ", "\t", "\n", "\r\n", "0", "1", "7", "42", "123",
    "'s", "'t", "'ll", "'", ".", ",", "!", "?", "-", "_", "(", ")", "{", "}", "<", ">", "/", "\\", "#", "@",
    "é", "ñ", "ü", "ø", "ж", "щ", "Ω", "λ", "中", "文", "字", "の", "ア", "한", "ก", "ि", "क", "ع", "ש",
    "😀", "👍🏽", "🇫🇷", "❤️", "\u0301", "\u00a0", "\u3000", "\u200b", "²", "٣", "hello", " world", "The",
    " the", "ing", "tion", "<|im_end|>", "<|im_start|>", "<s>", "</s>",
]


# Issue 17's edge cases: contractions before capitals and in all-caps words (Llama 3's and Qwen2's
# (?i:'s|...) must match "'T" in "'The" and "'LL" in "HE'LLO"), every Unicode White_Space and
# line-break character (HF's \s, Oniguruma's, is exactly White_Space: U+0085 NEL included, U+180E
# and U+200B not), lone CR, combining marks around letters, digits and apostrophes, and digits next
# to letters in many scripts (\p{N} takes Nd, Nl and No).
WHITESPACE = ["\t", "\n", "\x0b", "\x0c", "\r", " ", "\x85", "\xa0", "\u1680"] + \
    [chr(c) for c in range(0x2000, 0x200B)] + ["\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
NOT_WHITESPACE = ["\u180e", "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\x1c", "\x1f"]
EDGE = [
    "'The end", "HE'LLO", "I'M", "I'M here", "'S", "'Tis the season", "O'NEIL'S", "DON'T STOP", "WE'RE'VE'LL'D",
    "rock'N'roll", "x'M'y", "'LLAMA", "'Re 'Ve 'Ll 'D 'M 'T 'S", "it'S", "you'RE", "'ss 'tt 'mm", "''The", " 'The",
    "Don\u2019T curly", "'\u0301s", "'1st", "'\u0130s", "'\u212a", "a'\nThe", "\"'Hello'\"",
    "a \x85b", "a\x85b", "a \u2028b", "a \u2029b", "a \xa0b", "a \u3000b", "a\u3000 b", "x \rb", "a\r", "\rb",
    "a\rb", "\r\r", "\r \r", " \r", "\r\n\r", "a\r\n\rb", "\x85", " \x85", "\x85 ", "\x85\n", "a\x85\nb",
    "\u2028\u2029", "\u2028 x", "x\u2029\n", "\xa0\xa0x", "\u3000\u3000\u3000", "\x0b\x0c", "a \x0bb",
    "e\u0301", "\u0301", "\u0301a", "a \u0301b", "1\u0301", "12\u0301 3", "\u0301 \u0301", "x\u0308\u0301\u0327y",
    "\u0915\u093f\u0915", "\u0e01\u0e34\u0e4c", "\u05e9\u05b8\u05c1", "\u0627\u064b",
    "abc123def", "ABC123DEF", "x1y2z3", "1a2b3c", "a1234567b", "x\u0661\u0662\u0663y", "\u4e2d123\u6587",
    "\u03a9\u0663\u03bb", "\u0967\u0968\u0969\u0915", "\u0e51\u0e52\u0e53\u0e01", "\u2460a", "\u00b2x", "a\u00b2",
    "\u216bb", "\U0001d7d9\U0001d7dax", "\u0416123\u0436", "\u05d0\u0031\u05d1", "\uff11\uff12\uff41",
    "\u0aeb\u0a95", "\u1040\u1000", "\u17e1\u1780", "\u0f21\u0f40", "\u09e7\u0995", "\u3007\u4e00",
] + ["a" + w + "b" for w in WHITESPACE + NOT_WHITESPACE] + ["x " + w + "y" for w in WHITESPACE] + \
    ["'" + w + "T" for w in WHITESPACE[:6]]

# The classes the random edge-case strings draw from, each a list of short pieces.
EDGE_CLASSES = [
    ["'s", "'S", "'t", "'T", "'re", "'RE", "'Re", "'ve", "'VE", "'m", "'M", "'ll", "'LL", "'lL", "'d", "'D", "'",
     "\u2019", "'The", "'EM"],
    WHITESPACE + ["\r\n", "  ", "\n\n"],
    NOT_WHITESPACE,
    ["\u0300", "\u0301", "\u0308", "\u0327", "\u0345", "\u20dd", "\u093f", "\u0e34", "\u05b8", "\u064b", "\ufe0f"],
    ["a", "Z", "He", "LLO", "I", "the", "\u00e9", "\u00df", "\u0416", "\u0436", "\u03a9", "\u03bb", "\u4e2d",
     "\u3042", "\u30a2", "\ud55c", "\u0639", "\u05e9", "\u0915", "\u0e01", "\u10d0", "\u0531", "\u01c5"],
    ["0", "7", "12", "345", "6789", "\u0661", "\u0663\u0664", "\u0967", "\u0e51", "\u09e7", "\uff11", "\u00b2",
     "\u00bd", "\u2460", "\u216b", "\U0001d7d9", "\u3007", "\u1040"],
    [".", ",", "!", "?", "-", "(", ")", "\"", "#", "\u3002", "\u00bf", "\U0001f600"],
]


def edge_strings(n, seed=17):
    """n random strings built from EDGE_CLASSES (a fixed seed: the same strings every run)."""
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        out.append("".join(rnd.choice(rnd.choice(EDGE_CLASSES)) for _ in range(rnd.randint(2, 12))))
    return out


def test_strings():
    rnd = random.Random(20240601)
    out = list(FIXED) + EDGE + edge_strings(300)
    out += [str(10 ** k + 7 * k) for k in range(1, 25)]              # digits of many lengths
    out += [("x" + " " * k + "y") for k in range(1, 12)]             # whitespace runs
    out += [("x" + "\n" * k + " " * (k % 3) + "y") for k in range(1, 8)]
    for _ in range(160):                                               # random mixtures
        out.append("".join(rnd.choice(ALPHABET) for _ in range(rnd.randint(1, 24))))
    return out


# ---------------------------------------------------------------- checks


class Checker:
    def __init__(self, name):
        self.name, self.n, self.fail = name, 0, 0

    def eq(self, what, s, got, want):
        self.n += 1
        if got != want:
            self.fail += 1
            if self.fail <= 25:
                print(f"[{self.name}] {what} differs for {s!r}:\n   ours {got}\n   want {want}")

    def stream_ok(self, ctok, s, ids, flags, full):
        chunks = ctok.stream(ids, flags)
        self.eq("stream concatenation", s, b"".join(chunks), full)
        for c in chunks:  # the whole text is valid UTF-8, so no chunk may cut a character
            try:
                c.decode("utf-8")
            except UnicodeDecodeError:
                self.eq("stream chunk is UTF-8", s, c, "(whole characters)")
                break


def run_smollm(lib, path, strings):
    ck = Checker("smollm")
    tk, ctok = hf_smollm(path), CTok(lib, path)
    can_split_special = hasattr(tk, "encode_special_tokens")
    for s in strings:
        if can_split_special:
            tk.encode_special_tokens = False
        want = tk.encode(s, add_special_tokens=False).ids
        ids = ctok.encode(s, add_special=True, parse_special=True)  # SmolLM2 adds no BOS
        ck.eq("ids (parse_special)", s, ids, want)
        if can_split_special:
            tk.encode_special_tokens = True
            ck.eq("ids (special text as text)", s, ctok.encode(s, False, False), tk.encode(s, add_special_tokens=False).ids)
        text = ctok.decode(ids, PS_TOK_DECODE_SPECIAL)
        ck.eq("decode(encode(s))", s, text, s.encode())
        ck.eq("HF decode of our ids", s, tk.decode(ids, skip_special_tokens=False), s)
        ck.stream_ok(ctok, s, ids, PS_TOK_DECODE_SPECIAL, s.encode())
    ctok.close()
    print(f"[smollm] {ck.n - ck.fail}/{ck.n} checks passed on {len(strings)} strings")
    return ck.fail == 0


def run_variants(lib, path, strings):
    ok = True
    for pre in ["llama-bpe", "qwen2", "gpt-2"]:
        ck = Checker(pre)
        vpath = os.path.join(os.environ.get("PS_TEST_TMP", "/tmp"), f"tokenize_{pre}.gguf")
        write_variant(path, pre, vpath)
        tk, ctok = hf_variant(path, pre), CTok(lib, vpath)
        for s in strings:
            ids = ctok.encode(s, add_special=True, parse_special=True)
            ck.eq("ids", s, ids, tk.encode(s, add_special_tokens=False).ids)
            ck.eq("decode(encode(s))", s, ctok.decode(ids, PS_TOK_DECODE_SPECIAL), s.encode())
        ctok.close()
        print(f"[{pre} over SmolLM2's vocabulary] {ck.n - ck.fail}/{ck.n} checks passed")
        ok &= ck.fail == 0
    return ok


def run_synth_vocabs(lib, strings):
    """The vocabulary `pipeshard synth` writes (merges learnt from its own corpus: another
    vocabulary than SmolLM2's, and one a user's clone has too) under each pre-tokenizer the
    project's model families use, against HF with the original regexes."""
    ok = True
    bin_ = os.environ.get("PIPESHARD_BIN", "")
    require(os.access(bin_, os.X_OK), f"PIPESHARD_BIN={bin_!r} is not an executable (run through ctest)")
    for like, pre in (("smollm2-135m", "smollm"), ("llama-3.2-1b", "llama-bpe"), ("qwen2.5-1.5b", "qwen2")):
        ck = Checker(f"synth {pre}")
        path = os.path.join(os.environ.get("PS_TEST_TMP", "/tmp"), f"tokenize_synth_{pre}.gguf")
        p = subprocess.run([bin_, "synth", "--like", like, "--layers", "1", "--dim", "64", "--heads", "4",
                            "--kv-heads", "2", "--head-dim", "16", "--ffn", "128", "--vocab", "4096", "--type", "F32",
                            "-o", path], capture_output=True, text=True, timeout=120)
        require(p.returncode == 0, lambda: f"pipeshard synth --like {like}: {p.stderr[-800:]}")
        require(gguf_fields(path)("tokenizer.ggml.pre") == pre, f"synth --like {like} did not write pre {pre}")
        tk = hf_smollm(path) if pre == "smollm" else hf_variant(path, pre)
        ctok = CTok(lib, path)
        for s in strings:
            ids = ctok.encode(s, add_special=False, parse_special=True)
            ck.eq("ids", s, ids, tk.encode(s, add_special_tokens=False).ids)
            ck.eq("decode(encode(s))", s, ctok.decode(ids, PS_TOK_DECODE_SPECIAL), s.encode())
        ctok.close()
        print(f"[{pre} over synth's vocabulary] {ck.n - ck.fail}/{ck.n} checks passed")
        ok &= ck.fail == 0
    return ok


def run_stories(lib, path, strings):
    ck = Checker("stories260K")
    sp, ctok = sp_stories(path), CTok(lib, path)
    for s in strings:
        want = sp.encode(s, out_type=int)
        ck.eq("ids", s, ctok.encode(s, add_special=False, parse_special=False), want)
        ids = ctok.encode(s, add_special=True, parse_special=False)
        ck.eq("ids with BOS", s, ids, [1] + want)
        text = ctok.decode(ids, PS_TOK_DECODE_STRIP_SPACE)
        ck.eq("decode(encode(s))", s, text, s.encode())
        ck.eq("sentencepiece decode of our ids", s, sp.decode(ids), s)
        ck.stream_ok(ctok, s, ids, PS_TOK_DECODE_STRIP_SPACE, s.encode())
    ctok.close()
    print(f"[stories260K] {ck.n - ck.fail}/{ck.n} checks passed on {len(strings)} strings")
    return ck.fail == 0


def run_synth_spm(lib, strings):
    ck = Checker("synthetic SPM")
    path = os.path.join(os.environ.get("PS_TEST_TMP", "/tmp"), "tokenize_synth_spm.gguf")
    write_synth_spm(path)
    sp, ctok = sp_from_pieces(synth_spm_vocab()), CTok(lib, path)
    for s in strings:
        want = sp.encode(s, out_type=int)
        ids = ctok.encode(s, add_special=False, parse_special=False)
        ck.eq("ids", s, ids, want)
        ck.eq("decode(encode(s))", s, ctok.decode(ids, PS_TOK_DECODE_STRIP_SPACE), s.encode())
        ck.eq("sentencepiece decode of our ids", s, sp.decode(ids), s)
    ctok.close()
    print(f"[synthetic SPM] {ck.n - ck.fail}/{ck.n} checks passed on {len(strings)} strings")
    return ck.fail == 0


def main():
    lib = load_lib()
    strings = test_strings()
    require(len(strings) >= 200, lambda: f"only {len(strings)} test strings")
    smol = os.path.join(os.environ.get("PS_MODEL_CACHE", ".cache/models"), "SmolLM2-135M-Instruct.Q4_1.gguf")
    stories = os.path.join(os.environ.get("PS_SHARED_MODELS", "../shared/models"), "stories260K.gguf")
    ok = run_synth_spm(lib, strings)
    ok &= run_synth_vocabs(lib, strings)
    ran = 0
    if os.path.exists(smol):
        ran += 1
        ok &= run_smollm(lib, smol, strings)
        ok &= run_variants(lib, smol, strings)
    else:
        print(f"SKIPPED SmolLM2 part: {smol} is absent (run scripts/fetch_models.sh)")
    if os.path.exists(stories):
        ran += 1
        ok &= run_stories(lib, stories, strings)
    else:
        print(f"SKIPPED stories260K part: {stories} is absent (CI has ../shared/models)")
    if not ok:
        print("FAILED")
        return 1
    if ran < 2:  # what ran passed, but a part could not run: say so through CTest's "skipped"
        print(f"SKIPPED: {2 - ran} of the two model parts could not run (model file absent); the rest passed")
        return 77
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
