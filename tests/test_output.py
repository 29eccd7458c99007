"""The output processor (hybrid/engine/output.py): incremental text equal to a full decode, stop
strings cut where a full-text search would cut and never shown before they are ruled out, and a
cost linear in the generated length."""

import numpy as np
import pytest

from hybrid.engine import TextOutput
from hybrid.engine.output import IncrementalDetokenizer, StopStrings


class ByteTokenizer:
    """One token per UTF-8 byte (ids 0..255; 256 is end-of-sequence): a multi-byte character
    spans tokens, so windows that cut one decode to U+FFFD, as real byte-level BPE does.
    Counts the tokens it decodes."""

    eos_ids = [256]

    def __init__(self):
        self.decoded = 0

    def decode(self, ids, skip_special_tokens=True):
        self.decoded += len(ids)
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def encode(self, text):
        return list(text.encode("utf-8"))


TEXTS = ["plain ascii words", "naïve café — ünïcödé", "数字 and 漢字 mixed 🙂 emoji",
         "a\nb\n\nc\tstop here STOP there", ""]


def _stream(out: TextOutput, ids) -> str:
    shown = ""
    for t in ids:
        out.add(t)
        piece = out.delta(final=False)
        assert not piece.endswith("\ufffd")
        shown += piece
    out.finish()
    return shown + out.delta(final=True)


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_join_to_the_full_decode(text):
    tok = ByteTokenizer()
    ids = tok.encode(text)
    assert _stream(TextOutput(tok), ids) == text


def test_incremental_text_of_a_real_tokenizer_equals_a_full_decode():
    """SmolLM2's byte-level BPE over sampled (not just greedy) output with multi-byte text."""
    hybrid = pytest.importorskip("hybrid")
    from hybrid.models import ModelLoadError

    try:
        model = hybrid.load_model()
    except ModelLoadError as exc:
        pytest.skip(str(exc))
    tok = model.tokenizer
    for seed in range(4):
        ids = model.generate(tok.encode(f"Say {seed} in French, then 数字:"), 40,
                             temperature=1.0, seed=seed)
        out = TextOutput(tok, skip=tok.eos_ids)
        assert _stream(out, ids) == tok.decode([t for t in ids if t not in tok.eos_ids])
        assert out.text == tok.decode([t for t in ids if t not in tok.eos_ids])


def test_stop_tokens_add_no_text():
    """A request's stop tokens (end-of-sequence, or ordinary tokens given as stop_tokens) are
    kept in its ids but add nothing to its text."""
    tok = ByteTokenizer()
    out = TextOutput(tok, skip=[ord("!")])
    assert _stream(out, tok.encode("ab!")) == "ab" and out.text == "ab"


def test_stop_strings_cut_where_a_full_search_cuts(rng):
    """Random texts and stop sets: the text ends before the earliest stop string in the
    shortest prefix that holds one (the first to be completed), the shown pieces never pass
    that point, and nothing is held back at the end."""
    alphabet = list("abcé数 ")
    tok = ByteTokenizer()
    for _ in range(300):
        text = "".join(rng.choice(alphabet, int(rng.integers(0, 30))))
        stops = ["".join(rng.choice(alphabet, int(rng.integers(1, 4))))
                 for _ in range(int(rng.integers(1, 4)))]
        want, hits = text, []  # generation ends at the first stop string to be completed
        for k in range(1, len(text) + 1):
            hits = [i for i in (text[:k].find(s) for s in stops) if i >= 0]
            if hits:
                want = text[:min(hits)]
                break
        out = TextOutput(tok, stops)
        shown = ""
        for t in tok.encode(text):
            out.add(t)
            shown += out.delta(final=False)
            assert want.startswith(shown), (text, stops, shown)
        out.finish()
        shown += out.delta(final=True)
        assert shown == want and out.text == want, (text, stops)
        assert out.stopped == bool(hits)


def test_text_that_could_begin_a_stop_string_waits():
    tok = ByteTokenizer()
    out = TextOutput(tok, ["END"])
    for t in tok.encode("abcE"):
        out.add(t)
    assert out.delta(final=False) == "abc"  # "E" may begin "END"
    for t in tok.encode("x"):
        out.add(t)
    assert out.delta(final=False) == "Ex"  # it did not


def test_the_cost_is_linear_in_the_generated_length():
    """Tokens decoded (detokenizer) and characters searched (stop strings) per generated token
    stay bounded: a 4000-token output decodes under 4 windows' worth per token."""
    tok = ByteTokenizer()
    out = TextOutput(tok, ["never appears", "nor this"])
    ids = tok.encode("word 数字 " * 400)
    for t in ids:
        out.add(t)
        out.delta(final=False)
    assert tok.decoded < 4 * 4 * len(ids)

    searched = []
    stops = StopStrings(["xyz"])
    text = ""
    for i in range(4000):
        text += "a"
        before = stops.searched
        stops.find(text)
        searched.append(len(text) - max(0, before - 2))
    assert max(searched) <= 3


def test_detokenizer_holds_an_incomplete_character():
    tok = ByteTokenizer()
    d = IncrementalDetokenizer(tok)
    a, b, c = "数".encode("utf-8")
    assert d.add(a) == "" and d.add(b) == "" and d.add(c) == "数"
    d.add(0xE6)  # the first byte of another 3-byte character, never completed
    assert d.flush() == "\ufffd"


class LeadingSpaceTokenizer(ByteTokenizer):
    """Drops the space that starts a decoded window, as SentencePiece decoding does."""

    def decode(self, ids, skip_special_tokens=True):
        text = super().decode(ids, skip_special_tokens)
        return text[1:] if text.startswith(" ") else text


@pytest.mark.parametrize("text", ["a b  c", "x 数 y"])
def test_pieces_keep_the_spaces_a_window_start_would_drop(text):
    tok = LeadingSpaceTokenizer()
    assert _stream(TextOutput(tok), tok.encode(text)) == tok.decode(tok.encode(text))
