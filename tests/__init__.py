"""rankmesh test suite (a package, so tests and the torchrun workers import ``tests.mp`` and ``tests.conftest``)."""
