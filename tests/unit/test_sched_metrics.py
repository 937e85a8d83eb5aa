"""rstar2.rollout.sched_metrics (windows over a real scheduler's state and synthetic engine
stats) and rstar2.rollout.prometheus (a real HTTP endpoint, scraped and parsed)."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from rstar2.config import Config, ConfigError
from rstar2.rollout.engine import KVStats
from rstar2.rollout.prometheus import MetricsEndpoint
from rstar2.rollout.sched_metrics import SchedMetrics, SchedSample, sample
from rstar2.trainer.wiring import metrics_endpoint
from scheduler.core import Scheduler, SchedulerSettings
from tests.conftest import REPO, run_cli

CAPACITY = 1000


def _kv(used: int, *, waiting: int = 0, preempted: int = 0, queries=None, hits=None) -> KVStats:
    return KVStats(
        CAPACITY,
        used,
        1,
        waiting,
        preempted,
        prefix_queries_tokens=queries,
        prefix_hits_tokens=hits,
    )


def _two_engines() -> Scheduler:
    return Scheduler([CAPACITY, CAPACITY], SchedulerSettings(policy="round_robin"))


def _move(s: Scheduler) -> None:
    """Two dispatches and one migration: round_robin puts a trajectory's second turn on the
    engine that does not hold its prefix."""
    s.submit("t0", prompt_tokens=100, max_response_tokens=500)
    assert [a.engine_id for a in s.schedule()] == [0]
    s.generation_finished("t0", 20)
    s.turn_ready("t0", 150)
    (a,) = s.schedule()
    assert a.engine_id == 1 and a.moved


def test_a_window_averages_kv_use_and_counts_what_the_scheduler_did() -> None:
    s = _two_engines()
    metrics = SchedMetrics(2)
    metrics.observe(sample(s, [_kv(0), _kv(0)], waiting_turns=0))
    metrics.take()  # what came before is not the window's
    _move(s)
    metrics.observe(sample(s, [_kv(200, waiting=1), _kv(100)], waiting_turns=3))
    metrics.observe(sample(s, [_kv(400), _kv(300, waiting=2)], waiting_turns=1))
    out = metrics.take()
    assert out["sched/kv_used_ratio_mean/engine0"] == pytest.approx(0.3)
    assert out["sched/kv_used_ratio_max/engine0"] == pytest.approx(0.4)
    assert out["sched/kv_used_ratio_mean/engine1"] == pytest.approx(0.2)
    assert out["sched/kv_used_ratio_mean"] == pytest.approx(0.25)
    assert out["sched/waiting_turns_mean"] == 2 and out["sched/waiting_turns_max"] == 3
    assert out["sched/engine_waiting_requests_max"] == 2
    assert out["sched/dispatches"] == 2 and out["sched/migrations"] == 1
    assert out["sched/continuations"] == 0 and out["sched/redispatches"] == 0
    assert out["sched/preemptions"] == 0 and "sched/prefix_cache_hit_ratio" not in out
    assert out["sched/kv_reserved_ratio_mean"] == 0  # round_robin reserves nothing
    after = metrics.take()  # nothing observed since: no samples, and nothing happened
    assert after == {
        "sched/dispatches": 0,
        "sched/migrations": 0,
        "sched/continuations": 0,
        "sched/redispatches": 0,
        "sched/preemptions": 0,
    }


def test_reservations_are_read_from_the_scheduler() -> None:
    s = Scheduler([CAPACITY, CAPACITY], SchedulerSettings(policy="kv_affinity"))
    s.submit("t0", prompt_tokens=100, max_response_tokens=300)
    (a,) = s.schedule()
    got = sample(s, [_kv(100), _kv(0)], waiting_turns=0)
    reserved = s.engines[a.engine_id].reserved_tokens
    assert reserved > 0
    assert got.engines[a.engine_id].kv_reserved_ratio == reserved / CAPACITY
    assert got.engines[0].kv_used_ratio == 0.1 and got.engines[1].kv_used_ratio == 0.0


def test_a_closing_sample_counts_but_does_not_skew_the_kv_means() -> None:
    s = _two_engines()
    metrics = SchedMetrics(2)
    metrics.take(sample(s, [_kv(0), _kv(0)], waiting_turns=0))
    metrics.observe(sample(s, [_kv(500), _kv(500)], waiting_turns=0))
    _move(s)
    out = metrics.take(sample(s, [_kv(0), _kv(0)], waiting_turns=9))
    assert out["sched/kv_used_ratio_mean"] == 0.5  # the closing (idle) sample is left out
    assert out["sched/waiting_turns_max"] == 0
    assert out["sched/dispatches"] == 2 and out["sched/migrations"] == 1


def test_engine_counters_stay_monotonic_over_a_restart() -> None:
    s = _two_engines()
    metrics = SchedMetrics(2)
    metrics.take(sample(s, [_kv(0, preempted=2), _kv(0)], waiting_turns=0))
    metrics.observe(sample(s, [_kv(0, preempted=5), _kv(0, preempted=1)], waiting_turns=0))
    s.engine_down(0)
    down = sample(s, [None, _kv(0, preempted=1)], waiting_turns=0)
    assert not down.engines[0].up
    metrics.observe(down)
    first = metrics.take()
    assert first["sched/preemptions"] == 3 + 1
    assert "sched/kv_used_ratio_mean/engine0" in first  # sampled while it was up
    s.engine_up(0)
    metrics.observe(sample(s, [_kv(0, preempted=2), _kv(0, preempted=1)], waiting_turns=0))
    # no down sample between: a count going backwards is a fresh engine too
    metrics.observe(sample(s, [_kv(0, preempted=1), _kv(0, preempted=1)], waiting_turns=0))
    assert metrics.take()["sched/preemptions"] == 2 + 1
    live = metrics.live
    assert live is not None and live.totals.preemptions == (2 + 3 + 2 + 1, 1)


def test_prefix_cache_hit_ratio_over_the_engines_that_report_it() -> None:
    s = _two_engines()
    metrics = SchedMetrics(2)
    metrics.take(sample(s, [_kv(0, queries=100, hits=10), _kv(0)], waiting_turns=0))
    metrics.observe(sample(s, [_kv(0, queries=300, hits=160), _kv(0)], waiting_turns=0))
    out = metrics.take()
    assert out["sched/prefix_cache_hit_ratio"] == pytest.approx(150 / 200)
    assert "sched/prefix_cache_hit_ratio" not in metrics.take()  # no token queried since


def test_a_sample_must_match_the_engines() -> None:
    s = Scheduler([CAPACITY], SchedulerSettings())
    with pytest.raises(ValueError, match="1 engines"):
        sample(s, [_kv(0), _kv(0)], waiting_turns=0)
    with pytest.raises(ValueError, match="not 2"):
        SchedMetrics(2).observe(sample(s, [_kv(0)], waiting_turns=0))


# ---- the Prometheus endpoint ----


def _scrape(port: int) -> dict[tuple[str, str], float]:
    """{(sample name, engine label or ""): value} of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (smp.name, smp.labels.get("engine", "")): smp.value
        for family in text_string_to_metric_families(text)
        for smp in family.samples
        if smp.name.startswith("rstar2_")
    }


def _live_sample(s: Scheduler, waiting_turns: int, used: tuple[int, int]) -> SchedSample:
    stats = [_kv(used[0], preempted=3, queries=400, hits=100), _kv(used[1], waiting=2)]
    return sample(s, stats, waiting_turns=waiting_turns)


def test_the_endpoint_serves_the_latest_poll_and_frees_its_port() -> None:
    endpoint = MetricsEndpoint.start(0, addr="127.0.0.1")
    try:
        assert endpoint.port > 0
        assert _scrape(endpoint.port) == {}  # nothing watched yet
        metrics = SchedMetrics(2)
        endpoint.watch(metrics)
        s = _two_engines()
        _move(s)
        metrics.observe(_live_sample(s, 4, (250, 500)))
        got = _scrape(endpoint.port)
        assert got[("rstar2_engine_kv_used_ratio", "0")] == 0.25
        assert got[("rstar2_engine_kv_used_ratio", "1")] == 0.5
        assert got[("rstar2_engine_kv_reserved_ratio", "1")] == 0.0
        assert got[("rstar2_engine_up", "0")] == 1.0
        assert got[("rstar2_engine_waiting_requests", "1")] == 2
        assert got[("rstar2_scheduler_waiting_turns", "")] == 4
        assert got[("rstar2_scheduler_dispatches_total", "")] == 2
        assert got[("rstar2_scheduler_migrations_total", "")] == 1
        assert got[("rstar2_engine_preemptions_total", "0")] == 3
        assert got[("rstar2_engine_prefix_cache_queries_tokens_total", "0")] == 400
        assert got[("rstar2_engine_prefix_cache_hits_tokens_total", "0")] == 100
        assert ("rstar2_engine_prefix_cache_queries_tokens_total", "1") not in got  # None
        s.engine_down(1)  # live: the next poll's sample is what the next scrape shows
        metrics.observe(sample(s, [_kv(100, preempted=3), None], waiting_turns=0))
        got = _scrape(endpoint.port)
        assert got[("rstar2_engine_up", "1")] == 0.0
        assert ("rstar2_engine_kv_used_ratio", "1") not in got
        assert got[("rstar2_engine_kv_used_ratio", "0")] == 0.1
        assert got[("rstar2_scheduler_waiting_turns", "")] == 0
    finally:
        endpoint.close()
    endpoint.close()  # idempotent
    assert endpoint.closed
    with pytest.raises(urllib.error.URLError):
        _scrape(endpoint.port)
    again = MetricsEndpoint.start(endpoint.port, addr="127.0.0.1")  # the port was freed
    again.close()


def test_the_endpoint_answers_bad_requests_with_4xx_and_keeps_serving() -> None:
    endpoint = MetricsEndpoint.start(0, addr="127.0.0.1")
    base = f"http://127.0.0.1:{endpoint.port}"
    try:
        bad = {
            ("POST", "/metrics"): 405,
            ("PUT", "/metrics"): 405,
            ("DELETE", "/"): 405,
            ("GET", "/other"): 404,
            ("GET", "/metrics?verbose=1"): 400,
        }
        for (method, path), status in bad.items():
            request = urllib.request.Request(
                base + path, data=b"{}" if method != "GET" else None, method=method
            )
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(request, timeout=30)
            assert err.value.code == status, (method, path)
            assert err.value.read().decode().count("\n") == 1
        with urllib.request.urlopen(f"{base}/metrics?name[]=rstar2_engine_up", timeout=30) as r:
            assert r.status == 200  # Prometheus's own filter
        assert _scrape(endpoint.port) == {}
    finally:
        endpoint.close()


def _listening() -> socket.socket:
    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen()
    return sock


def test_a_busy_port_is_a_config_error_naming_the_key() -> None:
    with _listening() as busy:
        port = busy.getsockname()[1]
        with pytest.raises(OSError):
            MetricsEndpoint.start(port)
        cfg = Config.model_validate({"logging": {"metrics_port": port}})
        with pytest.raises(
            ConfigError, match=rf"logging\.metrics_port: cannot serve on port {port}"
        ):
            metrics_endpoint(cfg)
    assert metrics_endpoint(Config()) is None  # off by default


def test_rstar2_train_with_a_busy_port_stops_with_one_line(tmp_path) -> None:
    with _listening() as busy:
        port = busy.getsockname()[1]
        res = run_cli(
            "train",
            "--config",
            str(REPO / "configs" / "toy" / "cpu.yaml"),
            "--run-dir",
            str(tmp_path / "run"),
            f"logging.metrics_port={port}",
        )
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    (line,) = res.stderr.strip().splitlines()
    assert line.startswith("rstar2: config error: logging.metrics_port: cannot serve on port")
