"""Rollout engines: the :class:`~rstar2.rollout.engine.Engine` protocol and its vLLM forms."""
