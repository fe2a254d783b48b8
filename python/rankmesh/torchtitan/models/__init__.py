"""The configuration route: torchtitan's ``--module`` switch turns the acceleration on.

torchtitan (0.3.0) imports the module named by ``--module`` at start-up, before it initialises
``torch.distributed`` or builds a mesh, and reads the ``--config`` function from it. A short
model name is looked up under ``torchtitan.models`` (then ``torchtitan.experiments`` and
``torchtitan.experiments.rl.examples``); any other name is imported as a fully qualified module.

``rankmesh.torchtitan.models.<model>`` is such a module for every torchtitan model: importing it
calls :func:`rankmesh.torchtitan.accelerate` and then re-exports ``<model>``'s own
``config_registry``, so the same ``--config`` functions are found::

    # stock
    torchrun --nproc_per_node 8 -m torchtitan.train --module llama3 --config llama3_8b
    # the same job, meshes built by rankmesh
    torchrun --nproc_per_node 8 -m torchtitan.train \\
        --module rankmesh.torchtitan.models.llama3 --config llama3_8b

``<model>`` is one of torchtitan's short names (``llama3``, ``deepseek_v3``, ``qwen3``, ...). For a
config registry of your own, add ``import rankmesh.torchtitan; rankmesh.torchtitan.accelerate()``
at its top instead.

The modules are made on import by a finder registered here, one per model name; nothing about
torchtitan is imported until one is asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

__all__: list[str] = []

# Where torchtitan 0.3.0's ConfigManager looks up a short --module name, in its order.
_REGISTRY_PACKAGES = ("torchtitan.models", "torchtitan.experiments", "torchtitan.experiments.rl.examples")


def _import_registry(model: str) -> ModuleType:
    """torchtitan's own config registry for the short model name ``model``, found as torchtitan's
    ConfigManager finds it (the first of its packages that imports)."""
    failures = []
    for package in _REGISTRY_PACKAGES:
        name = f"{package}.{model}.config_registry"
        try:
            return importlib.import_module(name)
        except ImportError as e:
            failures.append(f"{name}: {e}")
    raise ModuleNotFoundError(
        f"rankmesh.torchtitan.models.{model}: torchtitan has no model named {model!r} that imports "
        f"({'; '.join(failures)}). Use one of torchtitan's --module short names, e.g. "
        f"--module {__name__}.llama3",
        name=f"{__name__}.{model}",
    )


class _RegistryLoader(importlib.abc.Loader):
    def __init__(self, model: str) -> None:
        self.model = model

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        from rankmesh.torchtitan import accelerate

        registry = _import_registry(self.model)  # first: a bad name leaves nothing patched
        accelerate()
        public = {k: v for k, v in vars(registry).items() if not k.startswith("_")}
        module.__dict__.update(public)
        module.__doc__ = (
            f"torchtitan's {registry.__name__}, with its meshes built by rankmesh "
            "(rankmesh.torchtitan.accelerate() was called on import)."
        )
        module.__all__ = list(public)  # type: ignore[attr-defined]
        module.__wrapped_registry__ = registry  # type: ignore[attr-defined]


class _RegistryFinder(importlib.abc.MetaPathFinder):
    """Finds ``rankmesh.torchtitan.models.<model>`` (one level, no dots in ``<model>``)."""

    prefix = __name__ + "."

    def find_spec(self, fullname: str, path: object = None, target: object = None):  # noqa: ANN201
        if not fullname.startswith(self.prefix):
            return None
        model = fullname[len(self.prefix) :]
        if not model.isidentifier():
            return None
        return importlib.machinery.ModuleSpec(fullname, _RegistryLoader(model), is_package=False)


if not any(isinstance(f, _RegistryFinder) for f in sys.meta_path):
    sys.meta_path.append(_RegistryFinder())
