"""A simulated NVML library driven by scenario files, for tests and demos."""
