"""What a loader produces: the model's shape and its float32 weights, whatever the file format."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..config import DecoderConfig, LayerWeights

ARCHITECTURES = ("llama", "qwen2", "qwen3")


@dataclass
class ModelWeights:
    """A decoder-only Llama-family model, ready to run.

    embed [vocab, hidden]; final_norm [hidden]; lm_head [vocab, hidden] (the same array as embed
    when the embeddings are tied); layers: one LayerWeights per decoder layer.
    """

    arch: str
    config: DecoderConfig  # the shape every layer shares
    embed: np.ndarray
    final_norm: np.ndarray
    lm_head: np.ndarray
    layers: list
    max_position: int = 0  # the model's context length (0: unknown)
    tied_embeddings: bool = False
    metadata: dict = field(default_factory=dict)  # format-specific extras (tokenizer, template)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def vocab_size(self) -> int:
        return self.embed.shape[0]

    def nbytes(self) -> int:
        seen, total = set(), 0
        arrays = [self.embed, self.final_norm, self.lm_head]
        for lw in self.layers:
            arrays += [a for a in vars(lw).values() if a is not None]
        for a in arrays:
            if id(a) not in seen:
                seen.add(id(a))
                total += a.nbytes
        return total


def unpermute_rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's converter permutation of Q/K rows (adjacent-pair RoPE layout back to the
    rotate-half layout transformers uses): per head, row 2i+s of the file is row s*D/2+i."""
    out_features = w.shape[0]
    half = out_features // n_head // 2
    return np.ascontiguousarray(
        w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def layer_weights(get, i: int, cfg: DecoderConfig, qk_norm: bool, qkv_bias: bool,
                  names: dict) -> LayerWeights:
    """Assemble layer ``i`` from ``get(name)`` with format-specific ``names`` templates."""
    def opt(key):
        return get(names[key].format(i=i)) if key in names else None

    return LayerWeights(
        attn_norm=get(names["attn_norm"].format(i=i)), wq=get(names["wq"].format(i=i)),
        wk=get(names["wk"].format(i=i)), wv=get(names["wv"].format(i=i)),
        wo=get(names["wo"].format(i=i)), mlp_norm=get(names["mlp_norm"].format(i=i)),
        w_gate=get(names["w_gate"].format(i=i)), w_up=get(names["w_up"].format(i=i)),
        w_down=get(names["w_down"].format(i=i)),
        q_norm=opt("q_norm") if qk_norm else None, k_norm=opt("k_norm") if qk_norm else None,
        bq=opt("bq") if qkv_bias else None, bk=opt("bk") if qkv_bias else None,
        bv=opt("bv") if qkv_bias else None)
