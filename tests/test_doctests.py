"""Every example in rankmesh's docstrings runs and prints what it shows.

The modules are found by walking the package (so a new module with examples is covered without
being listed here); the examples that need a process group set one up on torch's ``fake``
backend and destroy it again, which is checked too. ``+SKIP`` is refused outside ``SKIP_ALLOWED``.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import pkgutil
import warnings

import pytest
import rankmesh

# module -> why its examples may be skipped (they need a real cluster)
SKIP_ALLOWED = {
    "rankmesh.megatron.parallel_state": "initialize_model_parallel on an NCCL job with megatron-core",
}
NOT_IMPORTED = {"rankmesh.__main__"}  # importing it runs the command line


def _modules_with_examples() -> list[str]:
    names = ["rankmesh"]
    for info in pkgutil.walk_packages(rankmesh.__path__, "rankmesh."):
        if info.name not in NOT_IMPORTED:
            names.append(info.name)
    out = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue  # the native extension: its examples live in the stub, run by test_layout_api
        with open(spec.origin, encoding="utf-8") as f:
            if ">>>" in f.read():
                out.append(name)
    return sorted(out)


MODULES = _modules_with_examples()


def test_the_modules_this_issue_is_about_are_covered():
    assert {"rankmesh.process_groups", "rankmesh.torchtitan.parallel_dims", "rankmesh.mesh", "rankmesh"} <= set(MODULES)


def _import(name: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # e.g. megatron-core's "Apex is not installed" on CPU
        try:
            return importlib.import_module(name)
        except ImportError as e:  # an optional dependency (megatron-core, torchtitan) is absent
            pytest.skip(f"{name} needs {e.name}")


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = _import(name)
    dist = None
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a test dependency
        pass
    try:
        result = doctest.testmod(module, verbose=False, report=True, optionflags=doctest.ELLIPSIS)
    finally:
        left_open = dist is not None and dist.is_available() and dist.is_initialized()
        if left_open:
            dist.destroy_process_group()  # so a failing example cannot poison the next test
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (see above)"
    assert not left_open, f"an example in {name} left a process group initialised"
    skipped = inspect.getsource(module).count("doctest: +SKIP")
    if name in SKIP_ALLOWED:
        return
    assert skipped == 0, f"{name} skips {skipped} examples; make them run on the fake backend instead"
    assert result.attempted > 0, f"no examples ran in {name}"


def test_stub_examples_run():
    """The examples in the extension's stub (``_native.pyi``: the extension's own docstrings are
    short) run against the extension and print what they show."""
    import ast
    from pathlib import Path

    import rankmesh._native

    stub = Path(rankmesh.__file__).with_name("_native.pyi")
    tree = ast.parse(stub.read_text())
    parser, runner = doctest.DocTestParser(), doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    globs = {**vars(rankmesh._native), "rankmesh": rankmesh}  # the stub's names, as its examples use them
    attempted = 0
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            doc = ast.get_docstring(node, clean=True)
            if doc and ">>>" in doc:
                test = parser.get_doctest(doc, dict(globs), f"_native.pyi:{node.name}", str(stub), node.lineno)
                runner.run(test)
                attempted += len(test.examples)
    result = runner.summarize(verbose=False)
    assert attempted > 0 and result.failed == 0, f"{result.failed} of {attempted} stub examples failed (see above)"
