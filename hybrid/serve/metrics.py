"""Prometheus metrics of a serving engine (prometheus_client, one registry per app).

Gauges and totals are read from the engine's counters at each scrape; the time-to-first-token
and per-token latency histograms are observed as requests run.  ``hybrid_kv_blocks_used`` counts
blocks held by live requests (cached blocks no request holds are ``hybrid_kv_blocks_cached``).
"""

from __future__ import annotations

from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_GAUGES = [("requests_running", "Requests in the running batch"),
           ("requests_waiting", "Requests waiting to be admitted"),
           ("kv_blocks_used", "KV blocks held by live requests"),
           ("kv_blocks_cached", "KV blocks kept for prefix reuse, held by no request"),
           ("kv_blocks_total", "KV blocks in the pool")]
_TOTALS = [("prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache"),
           ("prompt_tokens", "Prompt tokens received"),
           ("prefill_tokens", "Prompt tokens computed (not those of cached prefixes)"),
           ("generation_tokens", "Tokens generated"),
           ("preemptions", "Requests preempted when the KV pool ran dry"),
           ("requests_aborted", "Requests aborted (their client left, or read too slowly)"),
           ("steps", "Engine steps"),
           ("draft_tokens", "Draft tokens fed by speculative decoding"),
           ("accepted_tokens", "Draft tokens the sampler kept")]
# ratios of the totals above, over the engine's life
_RATIOS = [("speculative_acceptance_rate", "Share of draft tokens the sampler kept",
            "accepted_tokens", "draft_tokens"),
           ("tokens_per_step", "Tokens generated per engine step", "generation_tokens", "steps")]


class _EngineCollector:
    def __init__(self):
        self.engine = None

    def collect(self):
        st = self.engine.stats() if self.engine is not None else {}
        for name, doc in _GAUGES:
            g = GaugeMetricFamily(f"hybrid_{name}", doc)
            g.add_metric([], float(st.get(name) or 0))
            yield g
        for name, doc in _TOTALS:
            c = CounterMetricFamily(f"hybrid_{name}", doc)
            c.add_metric([], float(st.get(name) or 0))
            yield c
        for name, doc, num, den in _RATIOS:
            g = GaugeMetricFamily(f"hybrid_{name}", doc)
            g.add_metric([], float(st.get(num) or 0) / float(st.get(den) or 0)
                         if st.get(den) else 0.0)
            yield g


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        self._engine = _EngineCollector()
        self.registry.register(self._engine)
        self.ttft = Histogram("hybrid_time_to_first_token_seconds", "Time to first token",
                              registry=self.registry,
                              buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
        self.token_latency = Histogram("hybrid_time_per_output_token_seconds",
                                       "Time between generated tokens", registry=self.registry,
                                       buckets=(.002, .005, .01, .02, .04, .08, .16, .32, .64, 1.5))

    def bind(self, engine) -> None:
        self._engine.engine = engine

    def response(self) -> Response:
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
