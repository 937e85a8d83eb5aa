# rstar2 on NVIDIA GPUs: vLLM's CUDA image (torch, vLLM, CUDA) plus rstar2[gpu] (megatron-core,
# Ray, ...), installed as README "GPU clusters" says. Code at /opt/rstar2, run by the image's
# python3 (what `launch.container` expects). Build, run and check: docker/README.md.

# vLLM 0.31.0 (torch 2.13.0+cu130, Python 3.12), pinned by tag and digest; not pulled on the
# machine that wrote this (no registry there): docker/README.md says how they were chosen.
ARG BASE_IMAGE=docker.io/vllm/vllm-openai:v0.31.0
ARG BASE_DIGEST=sha256:c1c9f6fd5c109ba7f0546a59f5b2f15fb87f64c77782e90a27b648b42a8e67c3
FROM ${BASE_IMAGE}@${BASE_DIGEST}
ARG BASE_IMAGE
ARG BASE_DIGEST
# A CA bundle for pip behind an intercepting proxy: mount it into the build and pass its path.
ARG HOST_CA_BUNDLE=""
ARG RSTAR2_COMMIT=unknown
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/rstar2
COPY . /opt/rstar2
# The base's packages (torch, vLLM, triton, ...) are constraints: pip may add packages, never
# change one the base ships, but for what docker/constraints-gpu.txt pins (Ray: every node of a
# cluster must run the version rstar2 is tested with). Transformer Engine is not installed: the megatron learner uses
# megatron-core's local spec (README), and its wheel would compile against the base's torch.
RUN if [ -n "$HOST_CA_BUNDLE" ]; then export PIP_CERT="$HOST_CA_BUNDLE"; fi \
    && python3 -m pip list --format=freeze | grep -viE '^ray==' > /tmp/base-constraints.txt \
    && python3 -m pip install --no-cache-dir -c /tmp/base-constraints.txt \
        -c docker/constraints-gpu.txt -e ".[gpu]" \
    && rm /tmp/base-constraints.txt \
    && python3 -m rstar2.doctor.versions --out /opt/rstar2/versions.json \
        --commit "$RSTAR2_COMMIT" --base-image "${BASE_IMAGE}@${BASE_DIGEST}" \
        --require rstar2 torch vllm megatron-core ray transformers -- transformer-engine
ENV RSTAR2_ACCELERATOR=cuda \
    PYTHONUNBUFFERED=1
# A non-root default user (rstar2, uid 10001); `docker run --user` and pyxis (the job's user)
# override it.
RUN useradd --create-home --shell /bin/bash --uid 10001 --user-group rstar2 \
    && install -d -o 10001 -g 10001 /workspace
USER 10001
# runs/ and caches land here (the code in /opt/rstar2 is root's, read-only to the user)
WORKDIR /workspace
ENTRYPOINT []
CMD ["rstar2", "doctor"]
