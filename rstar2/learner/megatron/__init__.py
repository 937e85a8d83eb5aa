"""The megatron-core learner backend (``learner.backend: megatron``): tensor and pipeline
parallelism over a GPTModel built from an HF Qwen2/Qwen3 config.

- :mod:`~rstar2.learner.megatron.layout`: a TP/PP layout checked against the model and the
  world size before anything is built, errors naming the config key (pure).
- :mod:`~rstar2.learner.megatron.convert`: HF <-> megatron weights per TP/PP shard (pure).
- :mod:`~rstar2.learner.megatron.model`: the GPTModel (local spec) for an HF config.
- :mod:`~rstar2.learner.megatron.attention`, :mod:`~rstar2.learner.megatron.flex`: exact
  causal attention on packed sequences without transformer-engine (SDPA per sequence on CPU,
  flex attention with a block-sparse document mask on GPU).
- :mod:`~rstar2.learner.megatron.learner`: the Learner protocol (log-probs, RL and SFT steps),
  through megatron's pipeline schedule, DDP and optimizer; :mod:`~.export` (HF-named weights
  for sync and HF folders), :mod:`~.checkpoint` (dist_checkpointing, loadable at any layout),
  :mod:`~.setup` (device, process group, DDP, whether megatron can run here).

megatron-core assumes CUDA: on a CPU it runs only under the test-support redirections of
tests/helpers/megatron_cpu.py, and ``rstar2 train`` refuses it there otherwise.
"""

import warnings

# megatron-core warns at import that TE and Apex are absent (the local spec is what this backend
# builds on purpose) and that a recompute scope it sets itself is deprecated: noise for a user
for _message in (
    r"(Transformer Engine|Apex).* not installed",
    r"full scope is deprecated",
):
    warnings.filterwarnings("ignore", message=_message, category=UserWarning)
