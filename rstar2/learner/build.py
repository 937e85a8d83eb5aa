"""The learner a config asks for: its settings from the config, and the learner built from them.

Explicit wiring: :data:`LearnerSettings` is one of the backends' settings types, and
:func:`build_learner` picks the backend by that type (no registry). megatron-core is imported only
when a megatron learner is built.
"""

from __future__ import annotations

from rstar2.config import Config, MegatronLearnerConfig, OptimConfig
from rstar2.learner.megatron.learner import MegatronLearner, MegatronLearnerSettings
from rstar2.learner.torch_backend import TorchLearner, TorchLearnerSettings

LearnerSettings = TorchLearnerSettings | MegatronLearnerSettings


def learner_settings(
    cfg: Config, model_path: str, *, optim: OptimConfig | None = None
) -> LearnerSettings:
    """The settings of ``cfg.learner``'s backend, training the weights at ``model_path``."""
    if isinstance(cfg.learner, MegatronLearnerConfig):
        return MegatronLearnerSettings.from_config(cfg, model_path, optim=optim)
    return TorchLearnerSettings.from_config(cfg, model_path, optim=optim)


def build_learner(settings: LearnerSettings) -> TorchLearner | MegatronLearner:
    """The learner of ``settings``' backend, in this process (both implement
    :class:`~rstar2.learner.protocol.Learner`)."""
    if isinstance(settings, MegatronLearnerSettings):
        return MegatronLearner(settings)
    return TorchLearner(settings)
