"""Probe kernels (not yet built)."""
