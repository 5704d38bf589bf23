"""Prometheus exposition of a ``MetricSet`` (``prometheus_client``: the ``metrics`` extra; this module is
imported only when metrics are asked for).

Each engine gets its own ``CollectorRegistry`` (never the process-wide default one), so two engines in one
process, or two tests, never collide; a collector reads the ``MetricSet`` at scrape time, so the exposition
is always the scheduler's current state and nothing is updated in the step loop. ``serve`` starts
prometheus_client's HTTP server for one registry (``GET /metrics``).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import groupby

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from dsakv.errors import DsakvError
from dsakv.telemetry.figures import COUNTER, METRICS, PREFIX, MetricSet


class MetricSetCollector:
    """A prometheus_client collector over a ``MetricSet`` (one metric family per name)."""

    def __init__(self, metrics: MetricSet) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        samples = sorted(self.metrics.samples(), key=lambda s: s.name)
        for name, group in groupby(samples, key=lambda s: s.name):
            kind, doc, label_names = METRICS[name.removeprefix(PREFIX)]
            family_type = CounterMetricFamily if kind == COUNTER else GaugeMetricFamily
            family = family_type(name, doc, labels=label_names)
            for s in group:
                family.add_metric([v for _, v in s.labels], s.value)
            yield family


def make_registry(metrics: MetricSet) -> CollectorRegistry:
    """A fresh registry holding only ``metrics``' collector."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(MetricSetCollector(metrics))
    return registry


def serve(registry: CollectorRegistry, port: int, addr: str = "127.0.0.1"):
    """Serve ``registry`` on ``http://addr:port/metrics`` from a daemon thread; returns the server (call
    ``shutdown()`` on it to stop). ``DsakvError`` when the port cannot be bound."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise DsakvError(f"metrics port = {port!r}: must be an integer in 0..65535")
    try:
        server, _thread = start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise DsakvError(f"metrics port = {port}: cannot serve on {addr}:{port} ({exc.strerror})") from None
    return server


__all__ = ["MetricSetCollector", "make_registry", "serve"]
