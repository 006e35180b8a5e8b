"""Collectors: one file each, registered by name with a default."""
