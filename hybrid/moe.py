"""Mixture-of-experts feed-forward blocks (Mixtral, Qwen3-MoE): a router picks the top k of E
SwiGLU experts for each row, and the row's output is their weighted sum.

    experts = ExpertWeights(router, gate, up, down, top_k=2, normalize=True)
    y = moe_forward(h, experts, linear, swiglu, role)      # h: [n, hidden] after the MLP norm

Routing is per row in float64 (each row's scores from its own mat-vec, so a row routes the same
alone or in a batch); the experts' weights stay in their encoding (memory-mapped GGUF slices).
A row reads only the experts it picked; the rows of a step are grouped by expert, so each
expert's weights are read once per step.  Each row adds its experts' outputs in the order of
its own ranking, which keeps a row's bits independent of the other rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .quant import QuantizedTensor


@dataclass
class ExpertWeights:
    """A layer's experts.  router [E, hidden] float32; gate, up: E matrices [I, hidden];
    down: E matrices [hidden, I] (arrays or QuantizedTensors).  Each row takes the ``top_k``
    experts of the router's softmax; ``normalize``: their weights are rescaled to sum to 1
    (Mixtral, Qwen3-MoE), else kept as softmax probabilities (OLMoE)."""

    router: np.ndarray
    gate: list
    up: list
    down: list
    top_k: int
    normalize: bool = True

    @property
    def num_experts(self) -> int:
        return len(self.gate)

    @property
    def intermediate_size(self) -> int:
        return self.gate[0].shape[0]

    def validated(self, hidden: int) -> "ExpertWeights":
        """A checked copy (float32 router); ValueError names what does not fit."""
        e = len(self.gate)
        if e < 1 or len(self.up) != e or len(self.down) != e:
            raise ValueError(f"experts: gate, up and down need one matrix per expert, got "
                             f"{len(self.gate)}, {len(self.up)}, {len(self.down)}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) \
                or not 1 <= self.top_k <= e:
            raise ValueError(f"experts: top_k must be in [1, {e}], got {self.top_k!r}")
        router = np.ascontiguousarray(np.asarray(self.router), dtype=np.float32)
        if router.shape != (e, hidden):
            raise ValueError(f"experts: the router has shape {router.shape}, expected "
                             f"({e}, {hidden})")
        inter = self.gate[0].shape[0]
        for name, mats, shape in (("gate", self.gate, (inter, hidden)),
                                  ("up", self.up, (inter, hidden)),
                                  ("down", self.down, (hidden, inter))):
            for i, m in enumerate(mats):
                if tuple(m.shape) != shape:
                    raise ValueError(f"experts: {name}[{i}] has shape {tuple(m.shape)}, "
                                     f"expected {shape}")
        conv = [[m if isinstance(m, QuantizedTensor)
                 else np.ascontiguousarray(m, dtype=np.float32) for m in mats]
                for mats in (self.gate, self.up, self.down)]
        out = ExpertWeights(router, *conv, top_k=self.top_k, normalize=bool(self.normalize))
        out.router64 = router.astype(np.float64)  # what the routing multiplies with
        return out

    def matrices(self) -> list:
        return [*self.gate, *self.up, *self.down]


def route(h: np.ndarray, experts: ExpertWeights):
    """(ids [n, k] int64, weights [n, k] float32): each row's experts, best first (ties: the
    lower id), and their weights."""
    router = getattr(experts, "router64", None)
    if router is None:
        router = experts.router.astype(np.float64)
    n, k = h.shape[0], experts.top_k
    ids = np.empty((n, k), dtype=np.int64)
    weights = np.empty((n, k), dtype=np.float32)
    for r in range(n):  # one mat-vec per row: its scores do not depend on the other rows
        s = router @ h[r].astype(np.float64)
        p = np.exp(s - s.max())
        p /= p.sum()
        top = np.lexsort((np.arange(s.shape[0]), -s))[:k]
        w = p[top]
        if experts.normalize:
            w = w / w.sum()
        ids[r], weights[r] = top, w
    return ids, weights


def moe_forward(h: np.ndarray, experts: ExpertWeights, linear, swiglu, role: str,
                counts: "np.ndarray | None" = None) -> np.ndarray:
    """[n, hidden] float32: the experts' weighted outputs for the rows of ``h``.  ``linear(x,
    w, role)`` and ``swiglu(gate, up)`` are the backend's kernels; ``counts`` (int64 [E]), when
    given, is incremented by how many rows picked each expert."""
    n, hidden = h.shape
    ids, weights = route(h, experts)
    parts = np.zeros((experts.top_k, n, hidden), dtype=np.float32)  # [rank, row, hidden]
    for e in np.unique(ids):
        rows, rank = np.nonzero(ids == e)
        x = np.ascontiguousarray(h[rows])
        act = swiglu(linear(x, experts.gate[e], role), linear(x, experts.up[e], role))
        parts[rank, rows] = linear(act, experts.down[e], role)
        if counts is not None:
            counts[e] += rows.shape[0]
    out = parts[0] * weights[:, 0:1]
    for j in range(1, experts.top_k):  # each row in its own ranking's order
        out += parts[j] * weights[:, j:j + 1]
    return out
