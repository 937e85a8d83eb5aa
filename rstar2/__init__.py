"""rstar2: the rStar2-Agent recipe (agentic RL with a Python tool, GRPO-RoC), reproducible."""

__version__ = "0.1.0"
