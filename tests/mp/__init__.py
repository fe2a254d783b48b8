"""Multi-process workers, run by torchrun as ``python -m tests.mp.<worker>`` from the repository root,
and their launch helpers."""
