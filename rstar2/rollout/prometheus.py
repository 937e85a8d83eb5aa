"""A Prometheus ``/metrics`` endpoint for live rollouts: the dispatcher's latest sample
(:attr:`rstar2.rollout.sched_metrics.SchedMetrics.live`), served over HTTP.

    endpoint = MetricsEndpoint.start(port=0)      # 0: a free port, see endpoint.port
    endpoint.watch(dispatcher.metrics)            # None again when the dispatcher closes
    ...
    endpoint.close()

Guarantees:
- Its own :class:`~prometheus_client.CollectorRegistry`: nothing else of the process (the
  global registry, vLLM's metrics) is exposed, and two endpoints never clash.
- Every scrape reads the latest sample the dispatcher's poll published (it is replaced whole,
  so one scrape is one consistent sample); nothing is updated on the poll's path.
- Counters (``*_total``) only grow over the endpoint's life, across engine restarts; while no
  dispatcher is watched, a scrape answers with no samples.
- A port that cannot be bound raises :class:`OSError` from :meth:`MetricsEndpoint.start`;
  :meth:`close` stops the server and frees the port (idempotent).
- ``GET`` (or ``HEAD``) ``/metrics`` (or ``/``) only: another method is 405, another path 404,
  a query other than Prometheus's own ``name[]`` filter 400, each with one line.

Metric names (``engine`` label: the engine slot, "0", "1", ...):
``rstar2_engine_up``, ``rstar2_engine_kv_used_ratio``, ``rstar2_engine_kv_reserved_ratio``,
``rstar2_engine_waiting_requests``, ``rstar2_engine_preemptions_total``,
``rstar2_engine_prefix_cache_queries_tokens_total``,
``rstar2_engine_prefix_cache_hits_tokens_total``, ``rstar2_scheduler_waiting_turns``,
``rstar2_scheduler_dispatches_total``, ``rstar2_scheduler_migrations_total``,
``rstar2_scheduler_continuations_total``, ``rstar2_scheduler_redispatches_total``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rstar2.rollout.sched_metrics import LiveView, SchedMetrics

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

_CLOSE_WAIT_S = 5.0


class _LiveCollector:
    """Builds the metric families from the watched metrics' latest sample at each scrape."""

    def __init__(self) -> None:
        self.source: SchedMetrics | None = None

    def collect(self) -> Iterator[Metric]:
        source = self.source
        live = source.live if source is not None else None
        if live is None:
            return
        yield from _engine_families(live)
        yield from _scheduler_families(live)


def _engine_families(live: LiveView) -> Iterator[Metric]:
    engines = live.sample.engines
    up = GaugeMetricFamily(
        "rstar2_engine_up", "1 while the engine takes dispatches, 0 while down", labels=["engine"]
    )
    used = GaugeMetricFamily(
        "rstar2_engine_kv_used_ratio",
        "KV cache in use, a fraction of capacity (the engine's own report)",
        labels=["engine"],
    )
    reserved = GaugeMetricFamily(
        "rstar2_engine_kv_reserved_ratio",
        "KV cache reserved by the scheduler's placements, a fraction of capacity",
        labels=["engine"],
    )
    waiting = GaugeMetricFamily(
        "rstar2_engine_waiting_requests",
        "Requests queued inside the engine (not yet running)",
        labels=["engine"],
    )
    for i, e in enumerate(engines):
        up.add_metric([str(i)], float(e.up))
        if e.up:
            used.add_metric([str(i)], e.kv_used_ratio)
            reserved.add_metric([str(i)], e.kv_reserved_ratio)
            waiting.add_metric([str(i)], e.waiting_requests)
    yield from (up, used, reserved, waiting)
    totals = live.totals
    preemptions = CounterMetricFamily(
        "rstar2_engine_preemptions", "Requests the engine preempted", labels=["engine"]
    )
    for i, n in enumerate(totals.preemptions):
        preemptions.add_metric([str(i)], n)
    yield preemptions
    for name, values, what in (
        ("queries", totals.prefix_queries_tokens, "Prompt tokens looked up in the prefix cache"),
        ("hits", totals.prefix_hits_tokens, "Prompt tokens found in the prefix cache"),
    ):
        family = CounterMetricFamily(
            f"rstar2_engine_prefix_cache_{name}_tokens", what, labels=["engine"]
        )
        for i, value in enumerate(values):
            if value is not None:
                family.add_metric([str(i)], value)
        yield family


def _scheduler_families(live: LiveView) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "rstar2_scheduler_waiting_turns",
        "Turns that asked for an engine and wait for the scheduler's placement",
        value=live.sample.waiting_turns,
    )
    totals = live.totals
    for name, value, what in (
        ("dispatches", totals.dispatches, "Requests the scheduler placed on an engine"),
        ("migrations", totals.migrations, "Dispatches placed away from their prefix's engine"),
        ("continuations", totals.continuations, "Dispatches continuing a turn's segment"),
        ("redispatches", totals.redispatches, "Dispatches lost with a failed engine, rerun"),
    ):
        yield CounterMetricFamily(f"rstar2_scheduler_{name}", what, value=value)


_App = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _only_metrics(app: _App) -> _App:
    """``app`` behind the checks the module docstring lists."""

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        def refuse(status: str, line: str, *headers: tuple[str, str]) -> list[bytes]:
            start_response(status, [("Content-Type", "text/plain; charset=utf-8"), *headers])
            return [f"{line}\n".encode()]

        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            return refuse("405 Method Not Allowed", "only GET /metrics", ("Allow", "GET, HEAD"))
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            return refuse("404 Not Found", "only GET /metrics")
        unknown = set(parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True))
        unknown -= {"name[]"}
        if unknown:
            return refuse("400 Bad Request", f"unknown query: {', '.join(sorted(unknown))}")
        return app(environ, start_response)

    return guarded


class _QuietHandler(WSGIRequestHandler):
    """No access log on stderr (the trainer's console)."""

    def log_message(self, format: str, *args: Any) -> None:
        pass


class MetricsEndpoint:
    """One HTTP server thread serving ``/metrics`` (see the module docstring)."""

    def __init__(self, server: WSGIServer, thread: threading.Thread, collector: _LiveCollector):
        self._server: WSGIServer | None = server
        self._thread = thread
        self._collector = collector
        self.port: int = int(server.server_port)

    @classmethod
    def start(cls, port: int, addr: str = "0.0.0.0") -> MetricsEndpoint:
        """Serve on ``addr``:``port`` (0: a free port); OSError when it cannot be bound."""
        from wsgiref.simple_server import make_server

        from prometheus_client import make_wsgi_app
        from prometheus_client.exposition import ThreadingWSGIServer

        collector = _LiveCollector()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        app = _only_metrics(make_wsgi_app(registry))
        server = make_server(addr, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        return cls(server, thread, collector)

    def watch(self, metrics: SchedMetrics | None) -> None:
        """Serve ``metrics``' live sample from now on (None: nothing)."""
        self._collector.source = metrics

    @property
    def closed(self) -> bool:
        return self._server is None

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        self._collector.source = None
        server.shutdown()
        server.server_close()
        self._thread.join(_CLOSE_WAIT_S)
