"""The megatron-core learner backend (``learner.backend: megatron``): tensor and pipeline
parallelism over a GPTModel built from an HF Qwen2/Qwen3 config.

- :mod:`~rstar2.learner.megatron.layout` checks a TP/PP layout against the model and the world
  size, before anything is built, with errors naming the config key.

Being built in steps; ``rstar2 train`` refuses the backend until the learner itself lands.
"""
