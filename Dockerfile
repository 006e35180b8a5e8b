# syntax=docker/dockerfile:1
# Two images from one file:
#   docker build --target agent     -t gpulens-agent .      # the per-node agent (no torch, no streamlit)
#   docker build --target dashboard -t gpulens-dashboard .  # the Streamlit dashboard
# The agent image carries no NVIDIA library: the NVIDIA container runtime injects the driver's NVML
# (NVIDIA_VISIBLE_DEVICES=all, NVIDIA_DRIVER_CAPABILITIES=utility), so one image fits every driver.
# For probes (--collector.probes) build the agent with torch: --build-arg AGENT_EXTRAS=kubernetes,torch.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# -- build: one wheel of the project ------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpulens/ gpulens/
COPY agent/ agent/
COPY dashboard/ dashboard/
COPY probes/ probes/
# rules/, deploy/, the runbooks and the documentation ship in the package as data (gpulens rules, grafana,
# files; the dashboard's Runbooks page); the documentation's images stay out (.dockerignore).
COPY rules/ rules/
COPY deploy/ deploy/
COPY docs/ docs/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# -- agent ----------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS agent
ARG AGENT_EXTRAS=kubernetes
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=utility
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir "$(ls /wheels/gpulens-*.whl)[${AGENT_EXTRAS}]"
# Root, with every capability dropped by the Helm chart: uid 0 owns the kubelet socket and the host
# directories the agent uses (helm/gpulens/README.md says why no capability is needed).
USER 0
EXPOSE 10906
ENTRYPOINT ["gpulens"]
CMD ["agent"]

# -- dashboard, and gpulens reclaim in Kubernetes (the chart runs it from this image) ---------------
FROM ${PYTHON_IMAGE} AS dashboard
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 HOME=/tmp
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir "$(ls /wheels/gpulens-*.whl)[dashboard,reclaim-kubernetes]" \
 && useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin gpulens
USER 10001
EXPOSE 10907
ENTRYPOINT ["gpulens"]
CMD ["dashboard", "--address", "0.0.0.0", "--prometheus", "http://prometheus:9090"]
