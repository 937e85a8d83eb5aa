"""launcher: SLURM / torchrun / Ray launch of rstar2 jobs on AMD (ROCm) and NVIDIA clusters."""
