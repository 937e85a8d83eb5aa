"""The reward's verification host under faults: real processes and real signals."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from concurrent.futures import Future
from pathlib import Path

import pytest

from rstar2.reward import RewardHostBroken, RewardScorer, samples
from rstar2.reward.host import HostedPool, function_ref
from rstar2.reward.verify import verify_answer

REF = function_ref(verify_answer)
RESULT_S = 120  # a cold host and worker on a loaded 2-core machine; a hang still fails


def _fails(future: Future[bool]) -> bool:
    try:
        future.result(RESULT_S)
    except RuntimeError:
        return True
    return False


def test_a_host_that_keeps_dying_stops_the_pool_with_a_reason():
    pool = HostedPool(1, REF, max_restarts=2)
    try:
        for _ in range(2):
            future = pool.submit("\\frac{1}{2}", "0.5", 1.0, 5.0)
            pool.replace()  # SIGKILL, before the cold worker can answer
            assert _fails(future)
        with pytest.raises(RewardHostBroken, match="died 2 times in a row"):
            pool.submit("\\frac{1}{2}", "0.5", 1.0, 5.0)
    finally:
        pool.close()


def test_a_dead_hosts_reader_leaves_the_new_hosts_calls_alone():
    pool = HostedPool(1, REF)
    try:
        old = pool.submit("\\frac{1}{2}", "0.5", 1.0, 5.0)
        pool.replace()
        new = [pool.submit("\\frac{1}{2}", "0.5", 1.0, 5.0) for _ in range(4)]
        assert _fails(old)
        assert [f.result(RESULT_S) for f in new] == [True] * 4
    finally:
        pool.close()


def test_a_forked_child_starts_its_own_host_and_leaves_the_parents_alone():
    pool = HostedPool(1, REF)
    try:
        assert pool.submit("\\frac{1}{2}", "0.5", 1.0, 5.0).result(RESULT_S) is True
        parent_host = pool.host_pid
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child reports through its exit code)
            code = 2
            try:
                ok = pool.submit("\\frac{3}{4}", "0.75", 1.0, 5.0).result(RESULT_S)
                code = 0 if ok and pool.host_pid not in (None, parent_host) else 1
                pool.close()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert pool.host_pid == parent_host
        assert pool.submit("2", "\\sqrt{4}", 1.0, 5.0).result(RESULT_S) is True
    finally:
        pool.close()


@pytest.mark.parametrize("form", ["sync", "async"])
def test_a_hung_host_is_replaced_and_the_call_is_not_cached(form):
    deadline_s = 4.0
    with RewardScorer(timeout_s=1.0, num_workers=1, host_deadline_s=deadline_s) as s:
        assert s.score(samples.response("\\frac{1}{2}"), "0.5") == 1.0  # warm
        host = s._pool.host_pid if s._pool else None
        assert host is not None
        os.kill(host, signal.SIGSTOP)  # alive, holding its pipes, never answering
        pair = (samples.response("\\frac{3}{4}"), "0.75")
        start = time.perf_counter()
        if form == "sync":
            assert s.score(*pair) == 0.0
        else:
            assert asyncio.run(s.ascore(*pair)) == 0.0
        assert deadline_s <= time.perf_counter() - start
        assert s.stats.worker_errors == 1
        assert s.score(*pair) == 1.0  # not cached: a new host verifies it
        assert s.stats.cache_hits == 0
        with pytest.raises(ProcessLookupError):
            for _ in range(200):  # the stopped host was killed and reaped
                os.kill(host, 0)
                time.sleep(0.05)


def test_a_verifier_that_cannot_be_pickled_is_refused_up_front():
    with pytest.raises(ValueError, match="cannot be sent"):
        RewardScorer(verify_fn=lambda pred, truth, s: True)


def test_a_verifier_in_a_module_run_with_python_m_works(tmp_path: Path):
    (tmp_path / "myverify.py").write_text(
        textwrap.dedent(
            """
            from rstar2.reward import RewardScorer, samples

            def same_number(pred, truth, inner_timeout_s):
                return float(pred) == float(truth)

            if __name__ == "__main__":
                with RewardScorer(num_workers=1, verify_fn=same_number) as s:
                    print("scores", s.score(samples.response("2.0"), "2"),
                          s.score(samples.response("3"), "2"))
            """
        )
    )
    out = subprocess.run(
        [sys.executable, "-m", "myverify"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["scores 1.0 0.0"]
