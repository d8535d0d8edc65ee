"""Pooling on a GPU (placeholder table; filled where the core kernels are numpy-only)."""
KERNELS: dict = {}
