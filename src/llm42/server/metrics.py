"""``GET /metrics``: the server's counters and the engine's snapshot as Prometheus text (format 0.0.4)."""

from __future__ import annotations

from collections import Counter

from llm42.async_engine import EngineSnapshot

__all__ = ["ServerMetrics"]

# the engine's own counters (DVRGenerator.stats), exported as llm42_<name>_total
_ENGINE_COUNTERS = {
    "steps": "engine iterations",
    "fast_steps": "fast-path steps",
    "fast_tokens": "tokens sampled on the fast path",
    "canonical_passes": "canonical (verification) passes",
    "confined_passes": "canonical passes run on the green context of --canonical-sms SMs",
    "canonical_rows": "canonical-pass rows run (R per pass)",
    "canonical_rows_used": "canonical-pass rows that carried real tokens",
    "committed_tokens": "tokens committed (returned to clients)",
    "accepted_tokens": "fast-path candidates the canonical pass confirmed",
    "rollbacks": "canonical passes in which a request rolled back",
    "recomputed_tokens": "candidate tokens discarded by rollbacks",
    "prefix_cached_tokens": "prompt tokens served from the prefix cache",
}


class ServerMetrics:
    """Counters kept by the HTTP handlers (one event loop: no locking)."""

    def __init__(self):
        self.requests: Counter[tuple[str, int]] = Counter()  # (endpoint, status) -> count
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.client_aborts = 0

    def count_request(self, endpoint: str, status: int) -> None:
        self.requests[(endpoint, status)] += 1

    def render(self, snapshot: EngineSnapshot) -> str:
        lines: list[str] = []

        def metric(name: str, kind: str, help_text: str, samples) -> None:
            lines.append(f"# HELP llm42_{name} {help_text}")
            lines.append(f"# TYPE llm42_{name} {kind}")
            for labels, value in samples:
                lines.append(f"llm42_{name}{labels} {value}")

        metric("http_requests_total", "counter", "HTTP requests answered, by endpoint and status",
               [(f'{{endpoint="{endpoint}",status="{status}"}}', count)
                for (endpoint, status), count in sorted(self.requests.items())])
        metric("prompt_tokens_total", "counter", "prompt tokens of accepted requests", [("", self.prompt_tokens)])
        metric("completion_tokens_total", "counter", "completion tokens answered", [("", self.completion_tokens)])
        metric("client_aborts_total", "counter", "requests aborted because the client disconnected",
               [("", self.client_aborts)])
        for name, help_text in _ENGINE_COUNTERS.items():
            metric(f"{name}_total", "counter", help_text, [("", snapshot.stats.get(name, 0))])
        metric("requests_pending", "gauge", "requests in the engine (queued or running)",
               [("", snapshot.num_pending)])
        metric("requests_running", "gauge", "requests admitted (holding K/V)", [("", snapshot.num_running)])
        metric("queue_depth", "gauge", "requests waiting for admission", [("", snapshot.num_waiting)])
        if snapshot.num_kv_blocks is not None:
            metric("kv_blocks", "gauge", "K/V blocks in the store", [("", snapshot.num_kv_blocks)])
        if snapshot.num_kv_used_blocks is not None:
            metric("kv_used_blocks", "gauge", "K/V blocks held by requests", [("", snapshot.num_kv_used_blocks)])
            if snapshot.num_kv_blocks:
                metric("kv_usage_ratio", "gauge", "fraction of K/V blocks held by requests",
                       [("", snapshot.num_kv_used_blocks / snapshot.num_kv_blocks)])
        if snapshot.num_kv_cached_blocks is not None:
            metric("kv_cached_blocks", "gauge", "prefix-cache blocks nobody holds (reusable)",
                   [("", snapshot.num_kv_cached_blocks)])
        metric("engine_running", "gauge", "1 while the engine loop accepts requests",
               [("", int(snapshot.is_running))])
        return "\n".join(lines) + "\n"
