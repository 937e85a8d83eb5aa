# rstar2 on AMD GPUs (MI300X): ROCm build of torch + vLLM from AMD's image, then rstar2[gpu].
# Build: docker build -f docker/rocm.Dockerfile -t rstar2:rocm .
ARG BASE=rocm/vllm:latest
FROM ${BASE}
WORKDIR /opt/rstar2
COPY . .
# torch and vllm come from the base image (ROCm builds); only the rest is installed here.
RUN pip install --no-cache-dir -e ".[dev]" "ray[default]>=2.40" "transformers>=4.56" "datasets>=3.0" \
    "megatron-core>=0.13"
ENV RSTAR2_ACCELERATOR=rocm
ENTRYPOINT ["rstar2"]
