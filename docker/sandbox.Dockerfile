# sandbox-pool service image: the core package only (no torch), plus the modules tool code may use.
# Build: docker build -f docker/sandbox.Dockerfile -t rstar2:sandbox .
# Run:   docker run --rm -p 8088:8088 rstar2:sandbox serve --host 0.0.0.0 --port 8088
FROM python:3.11-slim
WORKDIR /opt/rstar2
COPY pyproject.toml README.md ./
COPY rstar2 rstar2
COPY sandbox_pool sandbox_pool
COPY scheduler scheduler
COPY launcher launcher
COPY perf perf
RUN pip install --no-cache-dir . numpy sympy scipy && useradd --create-home sandbox
USER sandbox
EXPOSE 8088
ENTRYPOINT ["sandbox-pool"]
