# sandbox-pool: isolated Python (and C++) tool execution for rollouts, as an HTTP service
# (`serve`, the default) or a Redis consumer (`worker --redis URL`). CPU only, no torch.
# Build, run and the flags it needs: docker/README.md. CI builds and runs this file with buildah
# from a local Debian base (tests/integration/test_sandbox_image.py).

# The base, pinned by tag and digest (not pulled on the machine that wrote this: no registry
# there; docker/README.md). Any Debian 12 (bookworm) base works: CI passes a local one.
ARG BASE_IMAGE=docker.io/library/debian:bookworm-slim
ARG BASE_DIGEST=sha256:4724b8cc51e33e398f0e2e15e18d5ec2851ff0c2280647e1310bc1642182655d

# --- build: a venv with the pinned dependencies and rstar2's packages (no compilers kept) ------
FROM ${BASE_IMAGE}@${BASE_DIGEST} AS build
ARG BASE_IMAGE
ARG BASE_DIGEST
# A CA bundle for pip, for builds behind an intercepting proxy: mount the host's bundle into the
# build (`-v /etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro`) and pass its path here
# (it is used as PIP_CERT, which pip's build-isolation subprocess also reads).
ARG HOST_CA_BUNDLE=""
ARG RSTAR2_COMMIT=unknown
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# Debian's mirror keeps only the current version of a package, so exact pins would break
# rebuilds; the base digest fixes the release, and versions.json records what was installed.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
COPY docker/sandbox-requirements.txt /src/docker/
RUN if [ -n "$HOST_CA_BUNDLE" ]; then export PIP_CERT="$HOST_CA_BUNDLE"; fi \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check \
        -r /src/docker/sandbox-requirements.txt
COPY pyproject.toml README.md /src/
COPY rstar2 /src/rstar2
COPY sandbox_pool /src/sandbox_pool
COPY scheduler /src/scheduler
COPY launcher /src/launcher
COPY perf /src/perf
# --no-deps: the image needs sandbox_pool's dependencies (pinned above), not the trainer's.
RUN if [ -n "$HOST_CA_BUNDLE" ]; then export PIP_CERT="$HOST_CA_BUNDLE"; fi \
    && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps /src \
    && /opt/venv/bin/python -m rstar2.doctor.versions --out /opt/rstar2/versions.json \
        --commit "$RSTAR2_COMMIT" --base-image "${BASE_IMAGE}@${BASE_DIGEST}" \
        --require rstar2 aiohttp pydantic redis prometheus_client numpy sympy scipy

# --- runtime ------------------------------------------------------------------------------------
FROM ${BASE_IMAGE}@${BASE_DIGEST}
# g++ serves code-judge's C++ submissions; python3 is the interpreter the venv links to.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 g++ \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/rstar2/versions.json /opt/rstar2/versions.json
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# The service stays root inside the container: it needs root (and CAP_SYS_ADMIN) to give every
# call its own unprivileged uid and PID, mount, network and IPC namespaces (sandbox_pool's
# docstring). The calls never run as root. Without those rights it refuses to start.
# hadolint ignore=DL3002
USER 0
EXPOSE 8088
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8088/healthz', timeout=4)"]
ENTRYPOINT ["sandbox-pool"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8088"]
