"""GRPO-RoC: down-sampling (roc), group advantages (advantage), clipped token-level loss (loss).

Pure functions: no I/O, no distributed state; the loss uses torch tensors on any device.
"""
