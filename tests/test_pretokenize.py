"""GGUF byte-level BPE pre-tokenizers: for each tokenizer.ggml.pre name, the words hybrid's
tokenizer splits text into equal what llama.cpp's regex lists for that name give (the lists as
llama.cpp writes them, including its rewrites of the tokenizer.json patterns, run here by the
third-party ``regex`` module with llama.cpp's split rule).  An unknown name is refused."""

import pytest

from hybrid.models import ModelLoadError, Tokenizer
from hybrid.models.pretokenize import SPLITS

regex = pytest.importorskip("regex", reason="the regex module is the oracle's engine")
pytest.importorskip("tokenizers", reason="pip install '.[models]'")

_C = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
# llama.cpp's regex_exprs, per pre-tokenizer (src/llama-vocab.cpp)
LLAMA_CPP = {
    "llama3": [_C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+"],
    "qwen2": [_C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s+(?!\S)|\s+"],
    "smollm": [r"\p{N}", _GPT2],
    "gpt-2": [_GPT2],
    "gpt-4o": [r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + _C + "?"
               r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + _C + "?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "tekken": [r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+"
               r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*"
               r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "deepseek-llm": ["[\r\n]", "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+",
                     "\\s?[!-/:-~！-／：-～‘-‟　-。]+", "\\s+$", "[一-龥ࠀ-一가-퟿]+", "\\p{N}+"],
    "deepseek-coder": ["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
    "deepseek-v3": [r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+",
                    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?"""
                    r"""[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""],
    "default": [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
}
TEXTS = [
    "Hello world's 12345 digits and 3.14159, don'T WE'LL they're",
    "  leading spaces\n\nnew lines\r\n\tand tabs\t\tend   ",
    "CamelCaseWords HTTPServer iPhone ÀÉÎ ünïcödé ΑΒΓ αβγ Привет",
    "中文字符 and 日本語カタカナ 한국어 text",
    "emoji 🎉🎉 x=1+2; y==3 a/b/c\n/path <tag> $100 ^_^ ~|~",
    "def f(x):\n    return x**2  # comment\n\n\n",
]


def _llama_cpp_split(text, rules):
    """llama.cpp's unicode_regex_split: each regex splits every piece into its matches and the
    text between them."""
    pieces = [text]
    for rule in rules:
        pat, out = regex.compile(rule), []
        for p in pieces:
            pos = 0
            for m in pat.finditer(p):
                if m.start() > pos:
                    out.append(p[pos:m.start()])
                if m.end() > m.start():
                    out.append(m.group())
                pos = m.end()
            if pos < len(p):
                out.append(p[pos:])
        pieces = out
    return pieces


def _tokenizer(pre):
    # every byte a token (the byte-level alphabet), one merge: enough to build the pipeline
    from tokenizers.pre_tokenizers import ByteLevel
    alphabet = sorted(ByteLevel.alphabet())
    meta = {"tokenizer_model": "gpt2", "tokenizer_pre": pre, "tokens": alphabet + ["ab"],
            "merges": ["a b"]}
    return Tokenizer.from_gguf_metadata(meta, "test.gguf")


@pytest.mark.parametrize("pre", sorted(LLAMA_CPP))
def test_words_match_llama_cpp(pre):
    tok = _tokenizer(pre)
    for text in TEXTS:
        got = [text[a:b] for _, (a, b) in tok.backend.pre_tokenizer.pre_tokenize_str(text)]
        assert got == _llama_cpp_split(text, LLAMA_CPP[pre]), (pre, text)
        assert tok.decode(tok.encode(text)) == text  # bytes round-trip


def test_every_name_maps_to_a_tested_list():
    tested = {n: LLAMA_CPP[n] for n in LLAMA_CPP}
    for name, (rules, _) in SPLITS.items():
        assert any(SPLITS[t][0] == rules for t in tested), name


def test_unknown_and_missing_pre_types():
    with pytest.raises(ModelLoadError, match="tokenizer.ggml.pre 'mystery-bpe' is not a known"):
        _tokenizer("mystery-bpe")
    missing = _tokenizer(None)  # llama.cpp's "default" for a file without the key
    text = TEXTS[0]
    got = [text[a:b] for _, (a, b) in missing.backend.pre_tokenizer.pre_tokenize_str(text)]
    assert got == _llama_cpp_split(text, LLAMA_CPP["default"])
