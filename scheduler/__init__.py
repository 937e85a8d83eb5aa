"""scheduler: KV-cache-capacity-aware placement of multi-turn rollouts across vLLM engines."""
