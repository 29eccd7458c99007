"""How a GGUF byte-level BPE vocabulary splits text into words before merging, by its
``tokenizer.ggml.pre`` name: the regexes llama.cpp applies for that name, one after another
(each splits the pieces the previous one left, matches and the text between them alike).

Where llama.cpp rewrote a tokenizer.json pattern for its own regex engine, the original pattern
is used here (the ``tokenizers`` package runs it as the model's own tokenizer did).  A name not
in the table is refused: guessing a split gives other token ids than the model was trained on.
"""

from __future__ import annotations

_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
         r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
         rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
DEEPSEEK_CODER = [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"]
DEEPSEEK_V3 = [r"\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
               r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?"""
               r"""[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""]
# DeepSeek LLM's Latin, Greek, Cyrillic, ... letters (its tokenizer.json lists them as ranges)
_DS_LETTERS = "A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1f7dᾀ-ᾴᾶ-ᾼ\u1fbeῂ-ῄῆ-ῌῐ-\u1fd3ῖ-\u1fdbῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212a-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃"
DEEPSEEK_LLM = ["[\r\n]", rf"\s?[{_DS_LETTERS}]+", r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$", _CJK,
                r"\p{N}+"]
DEFAULT = [r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]

# tokenizer.ggml.pre -> (regexes in order, ignore_merges: a word that is a token is taken whole)
SPLITS = {}
for _names, _rules, _whole in [
        (("llama3", "llama-bpe", "llama-v3", "falcon3", "pixtral", "dbrx", "smaug-bpe",
          "chatglm-bpe", "glm4"), [LLAMA3], True),
        (("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"), [QWEN2], False),
        (("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
         [r"\p{N}", GPT2], False),
        (("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "trillion", "exaone4"), [GPT2], False),
        (("gpt-4o", "llama4"), [GPT4O], False),
        (("tekken",), [TEKKEN], True),
        (("deepseek-llm",), DEEPSEEK_LLM, False),
        (("deepseek-coder",), DEEPSEEK_CODER, False),
        (("deepseek-v3",), DEEPSEEK_V3, False),
        (("default",), DEFAULT, False)]:
    for _n in _names:
        SPLITS[_n] = (tuple(_rules), _whole)


def split_rules(pre: "str | None") -> "tuple[tuple, bool]":
    """(regexes, ignore_merges) for a ``tokenizer.ggml.pre`` name; a file without one gets
    llama.cpp's "default".  KeyError for a name not in the table."""
    return SPLITS["default" if pre is None else pre]
