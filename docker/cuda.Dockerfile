# rstar2 on NVIDIA GPUs: CUDA torch + vLLM from vLLM's image, then the rest of rstar2[gpu].
# Build: docker build -f docker/cuda.Dockerfile -t rstar2:cuda .
ARG BASE=vllm/vllm-openai:latest
FROM ${BASE}
WORKDIR /opt/rstar2
COPY . .
RUN pip install --no-cache-dir -e ".[dev]" "ray[default]>=2.40" "datasets>=3.0" \
    "megatron-core>=0.13" "transformer-engine[pytorch]>=2.4"
ENTRYPOINT ["rstar2"]
