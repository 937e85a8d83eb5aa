"""From the config tree to the settings each component takes (the trainer's wiring).

Every function here reads config sections and returns a component's own settings; nothing
else in the trainer copies config fields.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rstar2 import recipe
from rstar2.agent.loop import AgentSettings
from rstar2.config import Config, ConfigError
from rstar2.config_rules import check_run
from rstar2.runtime import ServicesSpec
from rstar2.runtime.placement import engine_weight_transfer

if TYPE_CHECKING:
    from rstar2.learner.build import LearnerSettings
    from rstar2.rollout.prometheus import MetricsEndpoint


def check_supported(cfg: Config) -> None:
    """ConfigError for what this build cannot run as configured: the config's own rules
    (:mod:`rstar2.config_rules`, already run by ``load_config``; again here for a config built
    in code) and what depends on this machine and command."""
    check_run(cfg)
    check_learner_supported(cfg)


def check_learner_supported(cfg: Config, *, torchrun_ranks: int | None = None) -> None:
    """ConfigError when ``cfg.learner``'s backend cannot run here (what ``rstar2 sft`` needs);
    ``torchrun_ranks``: the ranks torchrun started this command among (None: not torchrun)."""
    section = cfg.learner
    if torchrun_ranks is not None:
        if section.num_ranks != torchrun_ranks:
            raise ConfigError(
                "learner.num_ranks",
                f"torchrun started {torchrun_ranks} ranks but the config asks for "
                f"{section.num_ranks}: set learner.num_ranks={torchrun_ranks}",
            )
    elif section.num_ranks > 1 and not cfg.cluster.ray:
        raise ConfigError(
            "learner.num_ranks",
            f"{section.num_ranks} learner ranks start as a Ray learner group: set cluster.ray: "
            "true (or launch a learner-only job under torchrun)",
        )
    if cfg.learner.backend == "megatron":
        from rstar2.learner.megatron.setup import why_megatron_cannot_run

        reason = why_megatron_cannot_run(cfg.cluster.accelerator)
        if reason:
            raise ConfigError("learner.backend", reason)


def learner_settings(cfg: Config, model_path: str) -> LearnerSettings:
    from rstar2.learner.build import learner_settings

    return learner_settings(cfg, model_path)


def agent_settings(cfg: Config, max_turns: int, max_tokens: int) -> AgentSettings:
    a = cfg.agent
    return AgentSettings(
        max_turns=max_turns,
        max_response_tokens=max_tokens,
        tool_name=a.tool_name,
        max_parallel_tool_calls=a.max_parallel_tool_calls,
        tool_response_max_chars=a.tool_response_max_chars,
        tool_response_truncate_side=a.tool_response_truncate_side,
        tool_response_execution_time=a.tool_response_execution_time,
        tool_timeout_s=cfg.sandbox.max_execution_time_s,
        tool_memory_mb=cfg.sandbox.max_memory_mb,
        tool_max_output_chars=cfg.sandbox.max_output_chars,
    )


def metrics_endpoint(cfg: Config) -> MetricsEndpoint | None:
    """The Prometheus endpoint ``logging.metrics_port`` asks for (None: off); a port that
    cannot be bound is a ConfigError naming the key."""
    from rstar2.rollout.prometheus import MetricsEndpoint

    port = cfg.logging.metrics_port
    if port is None:
        return None
    try:
        return MetricsEndpoint.start(port)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            "logging.metrics_port", f"cannot serve on port {port}: {reason}"
        ) from None


def services_spec(cfg: Config, model_path: str) -> ServicesSpec:
    """The rollout side of ``cfg``: its engines (loading ``model_path``), sandbox, reward and
    scheduler sections."""
    from rstar2.rollout.vllm_engine import VLLMEngineConfig

    transfer = engine_weight_transfer(cfg)
    engine = VLLMEngineConfig(
        model_path=model_path,
        dtype=cfg.model.dtype,
        max_model_len=recipe.max_model_len(cfg),
        seed=cfg.seed,
        rollout=cfg.rollout,
        weight_transfer=transfer,
        sleep_mode=transfer == "ipc",
    )
    return ServicesSpec(
        engine=engine,
        num_engines=cfg.rollout.num_engines,
        sandbox=cfg.sandbox,
        reward=cfg.reward,
        scheduler=cfg.scheduler,
        weight_sync_bucket_bytes=cfg.learner.weight_sync_bucket_mb * 2**20,
    )
