"""Mixture-of-experts feed-forward blocks (Mixtral, Qwen3-MoE): a router picks the top k of E
SwiGLU experts for each row, and the row's output is their weighted sum.

    experts = ExpertWeights(router, gate, up, down, top_k=2, normalize=True)
    y = moe_forward(h, experts, kernels, role)  # h: [n, hidden] after the MLP norm

Routing takes each row's router scores from the backend's float32 linear (whose sums for a row do
not depend on the other rows) and the backend's routing of each row alone (softmax in float64),
so a row routes the same alone or in a batch, here or in the backend's native decode step; the
experts' weights stay in their encoding (memory-mapped GGUF slices).
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
        return ExpertWeights(router, *conv, top_k=self.top_k, normalize=bool(self.normalize))

    def matrices(self) -> list:
        return [*self.gate, *self.up, *self.down]


def moe_forward(h: np.ndarray, experts: ExpertWeights, kernels, role: str,
                counts: "np.ndarray | None" = None) -> np.ndarray:
    """[n, hidden] float32: the experts' weighted outputs for the rows of ``h``.
    ``kernels`` are the backend's (hybrid.ops.bind): linear_sets(sets, role) (sets of
    (x, [(W, out), ...])), moe_route(scores, top_k, normalize) and swiglu(gate, up, out);
    ``counts`` (int64 [E]), when given, is incremented by how many rows picked each expert.
    Every chosen expert's gate and up go to the backend in one call, then every down: at decode
    one parallel region each, however many experts."""
    n, hidden = h.shape
    k = experts.top_k
    scores = np.empty((n, experts.num_experts), dtype=np.float32)
    kernels.linear_sets([(h, [(experts.router, scores)])], role)  # each row's own mat-vec
    ids, weights = kernels.moe_route(scores, k, experts.normalize)
    if n == 1:  # one row: its experts already distinct, taken in its ranking's order
        order = rank = np.arange(k)
        rows = np.zeros(k, dtype=np.int64)
        chosen, sizes = ids[0], np.ones(k, dtype=np.int64)
        spans = [(e, j, j + 1) for j, e in enumerate(chosen.tolist())]
    else:  # the (row, rank) pairs sorted by expert, rows ascending within an expert
        order = np.argsort(ids.ravel(), kind="stable")
        by_expert = ids.ravel()[order]
        starts = np.concatenate(([0], np.flatnonzero(np.diff(by_expert)) + 1, [n * k]))
        chosen, sizes = by_expert[starts[:-1]], np.diff(starts)
        spans = list(zip(chosen.tolist(), starts[:-1].tolist(), starts[1:].tolist()))
        rows, rank = order // k, order % k
    gate = np.empty((n * k, experts.intermediate_size), dtype=np.float32)
    up = np.empty_like(gate)
    down = np.empty((n * k, hidden), dtype=np.float32)
    if n == 1:  # every chosen expert reads the one row: one set, the row quantized once
        kernels.linear_sets([(h, [m for e, a, b in spans
                                  for m in ((experts.gate[e], gate[a:b]),
                                            (experts.up[e], up[a:b]))])], role)
    else:
        x = h[rows]  # [n*k, hidden]: each expert's rows together
        kernels.linear_sets([(x[a:b], [(experts.gate[e], gate[a:b]), (experts.up[e], up[a:b])])
                             for e, a, b in spans], role)
    act = kernels.swiglu(gate, up, gate)
    kernels.linear_sets([(act[a:b], [(experts.down[e], down[a:b])]) for e, a, b in spans], role)
    down *= weights.ravel()[order][:, None]  # each (row, rank) output times its weight
    parts = np.empty((k, n, hidden), dtype=np.float32)  # [rank, row, hidden]
    parts[rank, rows] = down
    if counts is not None:
        counts[chosen] += sizes  # (chosen holds each expert once)
    out = parts[0]
    for j in range(1, k):  # each row's weighted outputs added in its own ranking's order
        out += parts[j]
    return out

