"""The per-node agent: NVML sampling, collectors and the Prometheus exporter."""
