"""Learner backends: turn kept trajectories into a policy update, and hand the weights to engines.

:mod:`rstar2.learner.protocol` defines the :class:`~rstar2.learner.protocol.Learner` interface
(no HF-specific types, so a megatron-core TP/PP backend can implement it);
:mod:`rstar2.learner.torch_backend` implements it on transformers models with FSDP2;
:mod:`rstar2.learner.packing` packs sequences into token-bounded micro-batches;
:mod:`rstar2.sync` moves the weights into the rollout engines.
"""
