# The gpu-utilization-exporter image. Build from the repository root:
#   docker build -t gpu-utilization-exporter .
# Run beside training jobs on a GPU host (NVIDIA Container Toolkit):
#   docker run --gpus all --pid host -p 9445:9445 gpu-utilization-exporter
# Without a registry, CI builds it with podman on a Debian base made by scripts/container-base.sh
# (docs/development.md). tests/test_docker.py lints this file with hadolint and replays the build
# stage's steps in a fresh virtual environment; tests/test_container.py builds the image and runs it.

ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS build
ARG VENV=/opt/gpu-exporter
# Optional: a package index mirror for pip, for builds where the public index is out of reach.
ARG PIP_INDEX_URL
WORKDIR /src
COPY pyproject.toml README.md setup.py ./
COPY exporter ./exporter
# pip and setuptools leave the environment once it is installed: the runtime image carries neither.
# Extras: kubernetes (pod attribution), tls (basic auth), sampling (py-spy, 8 MB: sampled phases of
# uninstrumented jobs, off unless sampling.rate is set; it needs --pid host and --cap-add SYS_PTRACE as root).
ARG EXTRAS=kubernetes,tls,sampling
RUN python -m venv "${VENV}" \
    && "${VENV}/bin/pip" install --no-cache-dir ".[${EXTRAS}]" \
    && "${VENV}/bin/pip" uninstall --yes --quiet pip setuptools

FROM ${PYTHON_IMAGE}
# An ARG declared before the first FROM is unset inside a stage until the stage declares it again.
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG VENV=/opt/gpu-exporter
LABEL org.opencontainers.image.title="gpu-utilization-exporter" \
      org.opencontainers.image.description="Prometheus exporter for NVIDIA GPUs that finds GPUs below 30% utilization and explains why." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
# NVIDIA Container Toolkit: expose every GPU and only the management library (NVML), no CUDA.
ENV PATH="${VENV}/bin:${PATH}" \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    HEALTHCHECK_URL=http://127.0.0.1:9445/readyz
COPY --from=build ${VENV} ${VENV}
RUN groupadd --system --gid 10001 gpu-exporter \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gpu-exporter
USER 10001:10001
EXPOSE 9445
# /readyz answers 200 only while GPU samples are fresh. Set HEALTHCHECK_URL to an https:// URL when the
# web config turns TLS on (the check does not verify the certificate; /readyz needs no credentials).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, ssl, urllib.request; urllib.request.urlopen(os.environ['HEALTHCHECK_URL'], timeout=4, context=ssl._create_unverified_context())"]
ENTRYPOINT ["gpu-exporter"]
