"""The one typed configuration tree of an rstar2 run.

Guarantees:
- Every field has a type, a default, bounds where they make sense, and a description; the unit of a
  quantity is in its name (``*_tokens``, ``*_s``, ``*_mb``, ``*_num_prompts``).
- The rStar2-Agent key names are kept where they exist (``augmentation.do_down_sampling``,
  ``augmentation.down_sampling_config.*``), so overrides written for the public port work unchanged.
- Unknown keys and bad values raise :class:`ConfigError`, whose ``key`` is the full dotted path.

Loading (YAML file plus dotted ``key=value`` overrides) lives in :mod:`rstar2.config_io`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, model_validator

from rstar2.agent.template import PromptFormat
from rstar2.config_base import ConfigError
from rstar2.config_base import Section as _Section
from rstar2.config_launch import LaunchConfig

__all__ = ["Config", "ConfigError", "LaunchConfig"]


class TinyModelConfig(_Section):
    """A randomly initialised Qwen3-architecture model built locally (the toy recipe, tests)."""

    hidden_size: int = Field(128, ge=32, description="Hidden width.")
    num_layers: int = Field(2, ge=1, description="Decoder layers.")
    num_heads: int = Field(2, ge=1, description="Attention heads of 64 dimensions each.")
    num_kv_heads: int = Field(1, ge=1, description="Key/value heads (grouped-query attention).")
    vocab_size: int = Field(
        3072, ge=300, description="Upper bound of the BPE vocabulary trained on the run's data."
    )
    digit_group: int | None = Field(
        1, ge=1, description="Split digit runs into pieces of at most this many digits."
    )
    tie_word_embeddings: bool = Field(True, description="Share input and output embeddings.")


class ModelConfig(_Section):
    path: str = Field(
        "Qwen/Qwen3-14B",
        description="HF model id or local folder of the policy's initial weights.",
    )
    tokenizer_path: str | None = Field(
        None, description="Tokenizer id or folder; None means the model's own."
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "bfloat16", description="Parameter dtype of the learner and engines (float32 on CPU)."
    )
    tiny: TinyModelConfig | None = Field(
        None,
        description="Build a tiny random-init model at `path` when that folder has no model "
        "yet (tokenizer trained on the SFT conversations and training prompts).",
    )


class DataConfig(_Section):
    train_datasets: list[str] = Field(
        default_factory=lambda: ["dapo17k"],
        description="Training prompt sources: built-in names (see `rstar2 data list`), "
        "local .jsonl/.parquet files, or `hf:ORG/NAME[:CONFIG][@SPLIT]` hub ids.",
    )
    eval_datasets: list[str] = Field(
        default_factory=lambda: ["aime24", "aime25"],
        description="Evaluation sources, same forms as train_datasets.",
    )
    rollout_batch_num_prompts: int = Field(
        512, ge=1, description="Distinct prompts sampled per RL step (before oversampling)."
    )
    max_prompt_tokens: int = Field(
        2048, ge=16, description="Prompts longer than this (after templating) are dropped."
    )
    shuffle: bool = Field(True, description="Shuffle training prompts each epoch (seeded).")
    decontaminate: bool = Field(
        True,
        description="Drop training problems sharing a word 8-gram with any built-in benchmark.",
    )
    strict: bool = Field(
        False,
        description="Stop with a one-line error on a bad training or eval row (not JSON, a "
        "missing or non-string problem or answer, a repeated id, a prompt over "
        "max_prompt_tokens) instead of skipping it with one warning line and a count in "
        "metrics.jsonl.",
    )


class RolloutConfig(_Section):
    num_samples_per_prompt: int = Field(
        32, ge=1, description="Rollouts generated per prompt (the oversampled 2G of GRPO-RoC)."
    )
    temperature: float = Field(
        1.0, ge=0.0, le=2.0, description="Sampling temperature during training."
    )
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    num_engines: int = Field(1, ge=1, description="vLLM engines serving rollouts.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per vLLM engine.")
    gpu_memory_utilization: float = Field(
        0.8, gt=0.0, le=1.0, description="Fraction of accelerator memory vLLM may use."
    )
    kv_cache_space_gb: float = Field(
        1.0, gt=0.0, description="KV-cache size per engine on CPU (vLLM kv_cache_memory_bytes)."
    )
    enforce_eager: bool = Field(
        False, description="Disable CUDA graphs / torch.compile in the engines (CPU: true)."
    )
    enable_prefix_caching: bool = Field(
        True,
        description="Reuse cached prompt prefixes. False makes a trajectory's tokens independent "
        "of what else the engine had cached (bit-exact resume on CPU), at the cost of prefills.",
    )
    max_staleness_steps: int = Field(
        0,
        ge=0,
        le=1,
        description="0: every step's rollouts come from the newest weights (the paper's "
        "synchronous loop). 1: the next step's rollouts are generated while the learner trains "
        "the current one, so a step learns from rollouts one update old (split placement only).",
    )


class AgentConfig(_Section):
    tool_name: str = Field(
        "python_code_with_standard_io", description="Name of the Python tool in the tool schema."
    )
    max_parallel_tool_calls: int = Field(
        4, ge=1, description="Tool calls served per assistant turn; extra calls get an error."
    )
    tool_response_max_chars: int = Field(
        256, ge=16, description="Tool output longer than this is truncated (characters)."
    )
    tool_response_truncate_side: Literal["left", "middle", "right"] = Field(
        "middle", description="Which part of an over-long tool output is cut."
    )
    tool_response_execution_time: bool = Field(
        True,
        description="End each tool response with 'execution time: X.XXs' (rStar2's format). "
        "False: a response depends on the code alone, not on the machine's load, as bit-exact "
        "resume needs.",
    )
    system_prompt: str | None = Field(
        None,
        description="System prompt; None: the model folder's rstar2_prompt.json, else rStar2's.",
    )
    show_tool_schema: bool | None = Field(
        None,
        description="Append the hermes tools block to the system prompt; None: as the model "
        "folder says, else true.",
    )

    def prompt_format(self, model_path: str) -> PromptFormat:
        """The prompt format for ``model_path``: these fields over the folder's saved one."""
        return PromptFormat.load(model_path).override(
            system_prompt=self.system_prompt, show_tool_schema=self.show_tool_schema
        )


class _SandboxSection(_Section):
    """What every sandbox mode shares: the limits each tool call is sent with."""

    max_execution_time_s: float = Field(
        4.0, gt=0.0, description="Wall-clock limit of one tool call (the port uses 4 s)."
    )
    max_memory_mb: int = Field(1024, ge=64, description="Address-space cap of one tool call.")
    max_output_chars: int = Field(
        65536, ge=256, description="stdout/stderr captured per call before cutting."
    )


class EmbeddedSandboxConfig(_SandboxSection):
    """An embedded sandbox pool, in the trainer's process (or a Ray actor under cluster.ray)."""

    mode: Literal["embedded"] = Field("embedded", description="Tool calls run in-process.")
    num_workers: int = Field(
        0, ge=0, description="Warm executors of the embedded pool; 0 means one per CPU core."
    )
    unsafe_weak_isolation: bool = Field(
        False,
        description="Run the embedded pool even where an isolation layer (per-call uids, "
        "namespaces, private /tmp) cannot be applied, e.g. without root. Off: the run stops "
        "with the missing layer named.",
    )


class HttpSandboxConfig(_SandboxSection):
    """A running `sandbox-pool serve` (or a code-judge-compatible service) at ``url``."""

    mode: Literal["http"] = Field(description="Tool calls go to a sandbox-pool server.")
    url: str = Field(description="sandbox-pool server URL, e.g. http://sandbox:8088.")
    max_wait_s: float = Field(
        600.0,
        gt=0.0,
        description="A call is retried (service unreachable, restarting, 429, 5xx) until this "
        "long after it was sent; then the model sees an internal_error tool response.",
    )


class RedisSandboxConfig(_SandboxSection):
    """Calls queued in Redis and served by `sandbox-pool worker --redis URL` processes."""

    mode: Literal["redis"] = Field(description="Tool calls go through a Redis queue.")
    redis_url: str = Field(description="Redis URL of the queue, e.g. redis://host:6379/0.")
    max_wait_s: float = Field(
        600.0, gt=0.0, description="A call no worker answered within this long fails."
    )


def _tag_of(field: str, default: str) -> Callable[[Any], str]:
    """The discriminator of a tagged section: its ``field``, ``default`` where it is unset."""

    def tag(value: Any) -> str:
        if isinstance(value, dict):
            return str(value.get(field, default))
        return str(getattr(value, field, default))

    return tag


SandboxConfig = Annotated[
    Annotated[EmbeddedSandboxConfig, Tag("embedded")]
    | Annotated[HttpSandboxConfig, Tag("http")]
    | Annotated[RedisSandboxConfig, Tag("redis")],
    Discriminator(_tag_of("mode", "embedded")),
]
"""``sandbox:`` is one of three shapes, chosen by ``mode`` (default ``embedded``)."""


class RewardConfig(_Section):
    timeout_s: float = Field(
        3.0, gt=0.0, description="Hard bound on one answer verification; past it the score is 0."
    )
    num_workers: int = Field(
        0, ge=0, description="Verification worker processes; 0 means min(4, CPU cores)."
    )
    cache_size: int = Field(
        65536, ge=0, description="LRU entries keyed on (extracted answer, ground truth)."
    )


class DownSamplingConfig(_Section):
    """The rStar2 `augmentation.down_sampling_config` block, plus `selection`."""

    down_sample_to_n: int = Field(
        16, ge=1, description="Traces kept per prompt group (G) after RoC down-sampling."
    )
    reject_equal_reward: bool = Field(
        True, description="Drop groups whose rewards are all equal (no learning signal)."
    )
    roc_error_ratio: bool = Field(
        True, description="Penalise positives by their tool-error ratio (p_err)."
    )
    roc_answer_format: bool = Field(
        True, description="Penalise positives by their answer-format violations (p_format)."
    )
    min_zero_reward_trace_num: int = Field(
        2, ge=0, description="Minimum negative traces kept in a group when it has them."
    )
    min_non_zero_reward_trace_num: int = Field(
        2, ge=0, description="Minimum positive traces kept in a group when it has them."
    )
    selection: Literal["reference", "paper"] = Field(
        "reference",
        description="'reference': the released deterministic choice; 'paper': the report's "
        "probabilistic one (positives sampled with weight 1/(penalty + epsilon)).",
    )
    penalty_epsilon: float = Field(
        1e-3, gt=0.0, description="The epsilon of the paper selection's 1/(penalty + epsilon)."
    )

    @model_validator(mode="after")
    def _minimums_fit(self) -> DownSamplingConfig:
        total = self.min_zero_reward_trace_num + self.min_non_zero_reward_trace_num
        if total > self.down_sample_to_n:
            raise ValueError(
                "min_zero_reward_trace_num + min_non_zero_reward_trace_num "
                f"({total}) exceeds down_sample_to_n ({self.down_sample_to_n})"
            )
        return self


class AugmentationConfig(_Section):
    do_down_sampling: bool = Field(True, description="Apply GRPO-RoC down-sampling (2G -> G).")
    down_sampling_config: DownSamplingConfig = Field(
        default_factory=DownSamplingConfig, description="RoC parameters (rStar2 key names)."
    )


class AlgorithmConfig(_Section):
    clip_ratio_low: float = Field(0.2, ge=0.0, description="PPO clip epsilon below 1.")
    clip_ratio_high: float = Field(0.28, ge=0.0, description="PPO clip epsilon above 1.")
    dual_clip_c: float = Field(
        3.0, gt=1.0, description="Dual-clip bound for negative advantages (c > 1)."
    )
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = Field(
        "token-mean", description="How per-token losses are reduced to one scalar."
    )
    norm_adv_by_std: bool = Field(
        True, description="Divide group-centred rewards by the group std (GRPO); false = Dr. GRPO."
    )
    recompute_old_logprobs: bool = Field(
        True,
        description="Old log-probs from a learner forward pass (verl's way) instead of the "
        "engine's sampling log-probs.",
    )
    kl_coef: float = Field(0.0, ge=0.0, description="KL-to-reference loss weight (0: off).")
    entropy_coef: float = Field(0.0, ge=0.0, description="Entropy bonus weight (0: off).")


class OptimConfig(_Section):
    lr: float = Field(1e-6, gt=0.0, description="AdamW peak learning rate.")
    warmup_steps: int = Field(20, ge=0, description="Linear warm-up steps from 0 to lr.")
    weight_decay: float = Field(0.01, ge=0.0, description="AdamW decoupled weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    grad_clip_norm: float = Field(1.0, gt=0.0, description="Global gradient-norm clip.")


class _LearnerSection(_Section):
    """What both learner backends share."""

    micro_batch_tokens_per_gpu: int = Field(
        16384, ge=64, description="Packed tokens per forward/backward micro-batch per GPU."
    )
    activation_checkpointing: bool = Field(True, description="Recompute activations in backward.")
    weight_sync_bucket_mb: int = Field(
        512, ge=1, description="Upper bound of one weight-sync bucket sent to the engines."
    )
    weight_sync_audit: bool = Field(
        False,
        description="After every weight sync, record each engine's weight checksum and export "
        "the learner's weights to <run>/sync_audit/ for `python -m rstar2.sync.audit RUN_DIR` "
        "(debugging: a full export per step).",
    )
    num_ranks: int = Field(
        1,
        ge=1,
        description="Learner processes (one GPU each on GPU nodes), started as a Ray learner "
        "group; more than 1 needs cluster.ray (or torchrun for a learner-only job).",
    )


class TorchLearnerConfig(_LearnerSection):
    """transformers models under FSDP2 (data parallel only)."""

    backend: Literal["torch"] = Field("torch", description="torch (FSDP2 on HF models).")
    offload_while_generating: bool = Field(
        False,
        description="Colocated placement: parameters and optimizer state move to host memory "
        "after each weight sync and back when the engines sleep, so the engines' KV cache can "
        "use the learner's GPU memory while they generate; needs cluster.colocate.",
    )


class MegatronLearnerConfig(_LearnerSection):
    """megatron-core GPTModel with tensor and pipeline parallelism."""

    backend: Literal["megatron"] = Field(description="megatron (megatron-core TP/PP).")
    tensor_parallel_size: int = Field(1, ge=1, description="Tensor parallel degree.")
    pipeline_parallel_size: int = Field(1, ge=1, description="Pipeline parallel degree.")
    sequence_parallel: bool = Field(
        False,
        description="Split norms, dropout and residuals along the sequence across the TP ranks "
        "(activation memory / TP); needs tensor_parallel_size > 1.",
    )


LearnerConfig = Annotated[
    Annotated[TorchLearnerConfig, Tag("torch")] | Annotated[MegatronLearnerConfig, Tag("megatron")],
    Discriminator(_tag_of("backend", "torch")),
]
"""``learner:`` is one of two shapes, chosen by ``backend`` (default ``torch``)."""


class SchedulerConfig(_Section):
    policy: Literal["round_robin", "least_requests", "sticky", "kv_capacity", "kv_affinity"] = (
        Field("kv_affinity", description="How generation turns are placed on engines.")
    )
    split_turns: bool = Field(
        True,
        description="kv_affinity may cap a turn at a segment and continue it in a further "
        "request; false keeps each turn one request, so a trajectory's tokens depend only on "
        "its seed (what exact resume and replay on CPU need).",
    )
    engine_stall_timeout_s: float | None = Field(
        300.0,
        gt=0,
        description="An engine with requests in flight that makes no progress (no engine step, "
        "no request finished) this long is hung: it is taken down, its turns move to the other "
        "engines and a replacement starts. null: never.",
    )


class StageConfig(_Section):
    name: str = Field(..., description="Stage label used in metrics and checkpoints.")
    num_steps: int = Field(..., ge=1, description="RL steps (optimizer updates) in this stage.")
    max_response_tokens: int = Field(
        ..., ge=16, description="Token budget of one trajectory's response (all turns)."
    )
    max_turns: int = Field(..., ge=1, description="Assistant turns allowed per trajectory.")
    data_filter: Literal["all", "hard_subset"] = Field(
        "all",
        description="'hard_subset': keep only problems the stage-start policy does not solve "
        "hard_subset_num_samples out of hard_subset_num_samples.",
    )
    hard_subset_num_samples: int = Field(
        8, ge=1, description="Samples per problem when building the hard subset."
    )
    reset_optimizer: bool = Field(False, description="Fresh optimizer state at stage start.")
    reset_reference: bool = Field(False, description="reference <- policy at stage start.")


class EvalConfig(_Section):
    every_steps: int = Field(50, ge=0, description="Evaluate every N RL steps (0: only at end).")
    num_samples: int = Field(16, ge=1, description="Samples per problem (avg@n).")
    temperature: float = Field(0.6, ge=0.0, le=2.0, description="Sampling temperature for eval.")
    max_response_tokens: int = Field(30720, ge=16, description="Token budget per eval response.")
    max_turns: int = Field(30, ge=1, description="Assistant turns per eval trajectory.")


class SftConfig(_Section):
    data: list[str] = Field(
        default_factory=list,
        description='JSONL files of conversations: one {"messages": [...]} per line, roles '
        "user / assistant / tool (assistant turns hold the <tool_call> blocks).",
    )
    num_epochs: int = Field(1, ge=1, description="Passes over the conversations.")
    batch_num_sequences: int = Field(32, ge=1, description="Conversations per optimizer step.")
    lr: float = Field(1e-5, gt=0.0, description="AdamW peak learning rate for SFT.")
    warmup_steps: int = Field(10, ge=0, description="Linear warm-up steps.")
    max_seq_tokens: int = Field(
        16384, ge=16, description="Longer conversations (after templating) are skipped and counted."
    )


class CheckpointConfig(_Section):
    every_steps: int = Field(20, ge=0, description="Checkpoint every N RL steps (0: only at end).")
    keep_last: int = Field(3, ge=1, description="Checkpoints kept on disk; older ones are deleted.")


class ClusterConfig(_Section):
    accelerator: Literal["cpu", "cuda", "rocm"] = Field(
        "cuda", description="Device family of the nodes."
    )
    num_nodes: int = Field(
        1, ge=1, description="Nodes in the job; more than one needs cluster.ray (or a launcher)."
    )
    gpus_per_node: int = Field(
        8,
        ge=0,
        description="Accelerators per node (0 on CPU); a one-process run checks that its "
        "engines and learner fit in them.",
    )
    ray: bool = Field(
        False,
        description="Place the learner, the rollout engines and the embedded sandbox pool in Ray "
        "actors (joins a running cluster, else starts a local one); false: everything in the "
        "trainer's process.",
    )
    gpu_memory_gib: float | None = Field(
        None,
        gt=0,
        description="Memory of one GPU, for the memory plan (rstar2 layout, rstar2 launch); "
        "None: 192 on rocm (MI300X), 80 on cuda (H100 80GB).",
    )
    colocate: bool = Field(
        False,
        description="Learner and engines share the GPUs: engines sleep (KV cache and weights "
        "freed) while the learner steps and receive weights through CUDA IPC (GPU and "
        "cluster.ray only). False: split placement, weights broadcast over NCCL on GPUs.",
    )


class LoggingConfig(_Section):
    tensorboard: bool = Field(False, description="Also write TensorBoard event files.")
    wandb_project: str | None = Field(None, description="Weights & Biases project; None: off.")
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Serve live rollout metrics (per-engine KV use, waiting turns, migrations, "
        "preemptions, prefix-cache tokens) for Prometheus at http://HOST:PORT/metrics on every "
        "interface; 0: a free port, printed at start; None: off.",
    )


class Config(_Section):
    """Root of the tree. ``rstar2 config show`` prints the resolved form."""

    name: str = Field(
        "rstar2", pattern=r"^[A-Za-z0-9._-]+$", description="Run name; the run folder's prefix."
    )
    runs_dir: str = Field("runs", description="Folder holding one sub-folder per run.")
    seed: int = Field(0, ge=0, description="Seed for data order, sampling and RoC selection.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model.")
    data: DataConfig = Field(default_factory=DataConfig, description="Prompt data.")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Rollout engines.")
    agent: AgentConfig = Field(default_factory=AgentConfig, description="Multi-turn tool loop.")
    sandbox: SandboxConfig = Field(
        default_factory=EmbeddedSandboxConfig, description="Tool execution."
    )
    reward: RewardConfig = Field(default_factory=RewardConfig, description="0/1 math reward.")
    augmentation: AugmentationConfig = Field(
        default_factory=AugmentationConfig, description="GRPO-RoC down-sampling (rStar2 names)."
    )
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="Loss.")
    optim: OptimConfig = Field(default_factory=OptimConfig, description="Optimizer.")
    learner: LearnerConfig = Field(
        default_factory=TorchLearnerConfig, description="Learner backend."
    )
    scheduler: SchedulerConfig = Field(
        default_factory=SchedulerConfig, description="Rollout placement."
    )
    stages: list[StageConfig] = Field(
        default_factory=lambda: [
            StageConfig(name="stage1", num_steps=300, max_response_tokens=8192, max_turns=10)
        ],
        min_length=1,
        description="RL stages, run in order.",
    )
    sft: SftConfig = Field(default_factory=SftConfig, description="Supervised cold start.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Periodic evaluation.")
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="Checkpointing."
    )
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Hardware.")
    logging: LoggingConfig = Field(default_factory=LoggingConfig, description="Metric sinks.")
    launch: LaunchConfig = Field(
        default_factory=LaunchConfig, description="Cluster job (rstar2 launch): nodes per role."
    )


def section_models(annotation: Any) -> dict[str, type[BaseModel]]:
    """The section models a field's annotation allows, by tag: ``{"torch": ..., "megatron":
    ...}`` for a tagged section, ``{"": Model}`` for a plain (or optional) one, ``{}`` for a
    leaf. For code that walks the tree (loading, documentation, tests)."""
    if typing.get_origin(annotation) is Annotated:
        inner, *extras = typing.get_args(annotation)
        tags = [e.tag for e in extras if isinstance(e, Tag)]
        found = section_models(inner)
        if tags and set(found) == {""}:
            return {tags[0]: found[""]}
        return found
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        out: dict[str, type[BaseModel]] = {}
        for arg in typing.get_args(annotation):
            out |= section_models(arg)
        return out
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {"": annotation}
    return {}


def discriminator_of(models: dict[str, type[BaseModel]]) -> str | None:
    """The field naming the shape of a tagged section (``mode``, ``backend``); None if plain."""
    if len(models) < 2:
        return None
    common = set.intersection(*(set(m.model_fields) for m in models.values()))
    for name in sorted(common):
        annotations = [m.model_fields[name].annotation for m in models.values()]
        if all(typing.get_origin(a) is Literal for a in annotations):
            return name
    return None
