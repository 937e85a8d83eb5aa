# rstar2 on AMD GPUs (MI300X): vLLM's ROCm image (ROCm, torch, vLLM) plus rstar2[gpu]
# (megatron-core, Ray, ...), installed as README "GPU clusters" says, with the launcher's MI300X
# profile (launcher/profiles/mi300x.env) as the environment's defaults. Code at /opt/rstar2, run
# by the image's python3 (what `launch.container` expects). Build, run and check: docker/README.md.

# vLLM 0.31.0 on ROCm 7.2.3 (torch 2.13.0, Python 3.12), pinned by tag and digest; not pulled on
# the machine that wrote this (no registry there): docker/README.md says how they were chosen.
ARG BASE_IMAGE=docker.io/vllm/vllm-openai-rocm:v0.31.0
ARG BASE_DIGEST=sha256:749f6f3f944f12af49966ac523c1f8573e4b229594b541954bd5f879b4496b1f
FROM ${BASE_IMAGE}@${BASE_DIGEST}
ARG BASE_IMAGE
ARG BASE_DIGEST
# A CA bundle for pip behind an intercepting proxy: mount it into the build and pass its path.
ARG HOST_CA_BUNDLE=""
ARG RSTAR2_COMMIT=unknown
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/rstar2
COPY . /opt/rstar2
# The base's packages (ROCm torch, vLLM, triton, aiter, ...) are constraints: pip may add
# packages, never change one the base ships, but for what docker/constraints-gpu.txt pins (Ray:
# every node of a cluster must run the version rstar2 is tested with). ROCm Transformer Engine is not built: the megatron
# learner uses megatron-core's local spec (README), so nothing here would import it.
RUN if [ -n "$HOST_CA_BUNDLE" ]; then export PIP_CERT="$HOST_CA_BUNDLE"; fi \
    && python3 -m pip list --format=freeze | grep -viE '^ray==' > /tmp/base-constraints.txt \
    && python3 -m pip install --no-cache-dir -c /tmp/base-constraints.txt \
        -c docker/constraints-gpu.txt -e ".[gpu]" \
    && rm /tmp/base-constraints.txt \
    && python3 -m rstar2.doctor.versions --out /opt/rstar2/versions.json \
        --commit "$RSTAR2_COMMIT" --base-image "${BASE_IMAGE}@${BASE_DIGEST}" \
        --require rstar2 torch vllm megatron-core ray transformers -- transformer-engine
# launcher/profiles/mi300x.env's exports (each value's reason and source are there); a value
# given at run time (`-e NAME=...`, or the job's env.sh) wins. Kept equal by
# tests/unit/test_dockerfiles.py.
ENV RSTAR2_ACCELERATOR=rocm \
    PYTHONUNBUFFERED=1 \
    HIP_FORCE_DEV_KERNARG=1 \
    TORCH_BLAS_PREFER_HIPBLASLT=1 \
    SAFETENSORS_FAST_GPU=1 \
    NCCL_MIN_NCHANNELS=112 \
    RCCL_MSCCL_ENABLE=0 \
    TORCH_NCCL_HIGH_PRIORITY=1 \
    GPU_MAX_HW_QUEUES=2 \
    TORCH_NCCL_ASYNC_ERROR_HANDLING=3 \
    VLLM_ROCM_USE_AITER=1
# A non-root default user (rstar2, uid 10001, in the image's video group; the host's video and
# render gids come with --group-add); `docker run --user` and pyxis (the job's user) override it.
RUN useradd --create-home --shell /bin/bash --uid 10001 --user-group --groups video rstar2 \
    && install -d -o 10001 -g 10001 /workspace
USER 10001
# runs/ and caches land here (the code in /opt/rstar2 is root's, read-only to the user)
WORKDIR /workspace
ENTRYPOINT []
CMD ["rstar2", "doctor"]
