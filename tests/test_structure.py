"""The package's structure: imports inside ``rankmesh`` go one way, along the data path
config → layout (Rust) → this rank's groups → process groups → DeviceMesh objects → convention.
The benchmark code (``rankmesh.bench``: benchmarks, workloads, demo) sits apart: it may import
anything, and nothing on the data path imports it.

Read from the source of the package under test (the installed wheel in CI), by ``ast``: every
``import`` of a ``rankmesh`` module counts, at module level or inside a function (a lazy import
is still a dependency), except under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import rankmesh

PACKAGE = Path(rankmesh.__file__).resolve().parent


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


class _Imports(ast.NodeVisitor):
    def __init__(self, modules: dict[str, Path]) -> None:
        self.modules = modules
        self.found: set[str] = set()

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level or not node.module or not node.module.startswith("rankmesh"):
            return
        submodules = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in self.modules]
        self.found.update(submodules)
        if len(submodules) < len(node.names):  # a name defined in the module itself
            self.found.add(node.module)

    def visit_Import(self, node: ast.Import) -> None:
        self.found.update(a.name for a in node.names if a.name.startswith("rankmesh"))


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        visitor = _Imports(modules)
        visitor.visit(ast.parse(path.read_text(), str(path)))
        graph[name] = {m for m in visitor.found if m in modules and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_inside_rankmesh():
    graph = import_graph()
    assert "rankmesh.process_groups" in graph and "rankmesh.mesh" in graph
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(
        " <-> ".join(f"{m} (imports {sorted(graph[m] & set(c))})" for m in c) for c in found
    )


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_process_groups_sit_below_the_meshes():
    """The process-group layer (and the consistency check on it) knows nothing of DeviceMesh: it
    imports no mesh module and its code names no ``DeviceMesh`` (its docs may)."""
    graph = import_graph()
    lows = ("rankmesh.process_groups", "rankmesh.consistency", "rankmesh._fast_groups", "rankmesh._fast_groups_check")
    for low in (*lows, "rankmesh._groups"):
        assert not {m for m in graph[low] if m.startswith("rankmesh.mesh")}, low
        tree = ast.parse((PACKAGE / (low.split(".")[1] + ".py")).read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {a.name.split(".")[-1] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not {n for n in names if "DeviceMesh" in n}, low


# -- each convention = torch-free rules + a torch face ------------------------------------------

#: The rules: what a convention means (layouts, groups, checks, plans, pictures). They import no
#: torch module, directly or through another rankmesh module, so they never build a process group
#: or a mesh; the faces (rankmesh.process_groups, rankmesh.mesh, rankmesh.megatron.groups,
#: rankmesh.megatron.parallel_state, rankmesh.torchtitan.parallel_dims, ...) do that.
RULE_MODULES = (
    "rankmesh.errors",
    "rankmesh._check",
    "rankmesh._dependencies",
    "rankmesh._once",
    "rankmesh._groups",
    "rankmesh.single",
    "rankmesh.topology",
    "rankmesh.megatron",
    "rankmesh.megatron.order",
    "rankmesh.megatron.generator",
    "rankmesh.megatron.layout",
    "rankmesh.torchtitan.layouts",
    "rankmesh._plan_parts",
    "rankmesh.job_plan",
    "rankmesh.plan",
    "rankmesh._picture",
)
TORCH_FACES = (
    "rankmesh.process_groups",
    "rankmesh.mesh",
    "rankmesh._fast_groups",
    "rankmesh._fast_groups_check",
    "rankmesh._torch_compat",
)


def _torch_imports(path: Path) -> set[str]:
    """The torch modules a file imports (anywhere, lazily too; not under ``if TYPE_CHECKING``)."""

    class _Torch(_Imports):
        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            if not node.level and node.module and node.module.split(".")[0] == "torch":
                self.found.add(node.module)

        def visit_Import(self, node: ast.Import) -> None:
            self.found.update(a.name for a in node.names if a.name.split(".")[0] == "torch")

    visitor = _Torch({})
    visitor.visit(ast.parse(path.read_text(), str(path)))
    return visitor.found


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """``start`` and every rankmesh module it imports, directly or not."""
    seen, todo = {start}, [start]
    while todo:
        for m in graph[todo.pop()]:
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def rule_violations(graph: dict[str, set[str]], torch_imports: dict[str, set[str]]) -> dict[str, list[str]]:
    """For each rule module, the modules it reaches that import torch or are a torch face."""
    out = {}
    for rule in RULE_MODULES:
        bad = sorted(m for m in _reach(graph, rule) if torch_imports.get(m) or m in TORCH_FACES)
        if bad:
            out[rule] = bad
    return out


def test_rule_modules_import_no_torch_and_no_torch_face():
    graph, modules = import_graph(), _modules()
    assert set(RULE_MODULES) <= set(graph)
    torch_imports = {name: _torch_imports(path) for name, path in modules.items()}
    assert torch_imports["rankmesh.process_groups"] and torch_imports["rankmesh.mesh"]  # the check sees imports
    assert rule_violations(graph, torch_imports) == {}


def test_the_rule_check_finds_a_torch_import_behind_another_module():
    graph = {m: set() for m in RULE_MODULES} | {"helper": {"rankmesh.process_groups"}, "rankmesh.process_groups": set()}
    graph["rankmesh.single"] = {"helper"}
    found = rule_violations(graph, {"rankmesh.process_groups": {"torch.distributed"}})
    assert found == {"rankmesh.single": ["rankmesh.process_groups"]}
    graph["rankmesh.single"] = set()
    assert rule_violations(graph, {"rankmesh.topology": {"torch"}}) == {"rankmesh.topology": ["rankmesh.topology"]}


# -- the benchmark code sits apart from the data path ---------------------------------------------

BENCH = "rankmesh.bench"
#: The only modules outside rankmesh.bench that may import it: the command line, which hands
#: ``bench ...`` to it lazily (``python -m rankmesh`` is the command line).
BENCH_ENTRIES = ("rankmesh.cli", "rankmesh.__main__")


def _in_bench(module: str) -> bool:
    return module == BENCH or module.startswith(BENCH + ".")


def _named_modules(path: Path, modules: dict[str, Path]) -> set[str]:
    """The rankmesh modules a file names in a string of its own (a ``lazy_getattr`` table, an
    ``importlib.import_module`` argument): imports no ``import`` statement shows."""
    tree = ast.parse(path.read_text(), str(path))
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in modules}


def bench_importers(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """For each module outside rankmesh.bench and its entries, the rankmesh.bench modules it imports."""
    out = {}
    for name, deps in graph.items():
        if _in_bench(name) or name in BENCH_ENTRIES:
            continue
        bad = sorted(m for m in deps if _in_bench(m))
        if bad:
            out[name] = bad
    return out


def test_nothing_on_the_data_path_imports_the_benchmarks():
    modules = _modules()
    graph = {name: deps | (_named_modules(modules[name], modules) - {name}) for name, deps in import_graph().items()}
    assert {f"{BENCH}.workloads", f"{BENCH}.titan_workloads", f"{BENCH}.demo"} <= set(graph)
    assert {BENCH, f"{BENCH}.model"} <= graph["rankmesh.cli"]  # the check sees the command line's lazy imports
    assert bench_importers(graph) == {}


def test_the_bench_check_finds_an_import_of_the_benchmarks():
    graph = {
        "rankmesh.cli": {BENCH, f"{BENCH}.model"},
        f"{BENCH}.model": {"rankmesh.mesh", f"{BENCH}.workloads"},
        f"{BENCH}.workloads": {"rankmesh.mesh"},
        "rankmesh.mesh": {"rankmesh.process_groups"},
        "rankmesh.process_groups": set(),
    }
    assert bench_importers(graph) == {}
    graph["rankmesh.mesh"] = {"rankmesh.process_groups", f"{BENCH}.workloads"}
    graph["rankmesh.benchmarks"] = {BENCH}  # a name that merely starts like it is not inside it
    assert bench_importers(graph) == {"rankmesh.mesh": [f"{BENCH}.workloads"], "rankmesh.benchmarks": [BENCH]}


# -- private torch state: touched in three named modules, each checked at start-up ---------------

# rankmesh._torch_compat (DeviceMesh, the layout algebra; checked by rankmesh._mesh_check) and
# rankmesh._fast_groups with rankmesh._fast_groups_check (c10d's group registry, and its start-up
# checks) are the only modules that may import or read torch's private state by name.
PRIVATE_HOMES = {"rankmesh._torch_compat", "rankmesh._fast_groups", "rankmesh._fast_groups_check"}
# Outside the data path, by name, with the reason.
PRIVATE_ELSEWHERE = {
    # clear_dtensor_caches empties DTensor's sharding and redistribution caches between benchmark
    # runs, each through getattr (a cache torch renames is skipped); no group or mesh depends on it.
    "rankmesh.bench.workloads": {
        "from torch.distributed.tensor import _collective_utils",
        "from torch.distributed.tensor import _redistribute",
        "from torch.distributed.tensor.debug import _clear_sharding_prop_cache",
        "getattr(_redistribute, '_planner_cache')",
    },
}
_C10D = ("c10d", "distributed_c10d", "_world", "_C", "_distributed_c10d", "_mesh_layout")


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def private_torch_uses(tree: ast.AST) -> list[str]:
    """Imports of torch's private names or modules, ``<c10d>._x`` reads, and private names read
    through a string (``getattr(x, "_x")``, ``hasattr``, ``setattr``, ``delattr``: the names no
    attribute check sees), in one module. rankmesh's own objects never need the string form."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr", "delattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and node.args[1].value.startswith("_")
            and not node.args[1].value.startswith("__")
        ):
            found.append(f"{node.func.id}({_dotted(node.args[0])}, {node.args[1].value!r})")
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            if node.module.startswith("torch.testing._internal"):  # the fake backend's test helpers
                continue
            private_module = any(p.startswith("_") for p in node.module.split("."))
            found += [f"from {node.module} import {a.name}" for a in node.names if private_module or a.name[0] == "_"]
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if _dotted(node.value).split(".")[-1] in _C10D:
                found.append(_dotted(node))
    return found


def test_private_torch_state_is_touched_only_where_it_is_checked():
    offenders = {}
    for name, path in _modules().items():
        if name not in PRIVATE_HOMES:
            uses = set(private_torch_uses(ast.parse(path.read_text(), str(path)))) - PRIVATE_ELSEWHERE.get(name, set())
            if uses:
                offenders[name] = uses
    assert not offenders, offenders


def test_the_private_use_check_finds_them():
    src = (
        "from torch.distributed.distributed_c10d import _world\n"
        "from torch.distributed._mesh_layout import MeshThing\n"
        "from torch.testing._internal.distributed.fake_pg import FakeStore\n"
        "import torch.distributed as dist\n"
        "x = dist.distributed_c10d._resolve_process_group('g')\n"
        "n = c10d._world.group_count\n"
        "ok = dist.get_rank()\n"
        "t = getattr(opts, '_timeout', None)\n"
        "fine = getattr(opts, '__doc__', None)\n"
    )
    assert sorted(private_torch_uses(ast.parse(src))) == sorted(
        [
            "from torch.distributed.distributed_c10d import _world",
            "from torch.distributed._mesh_layout import MeshThing",
            "dist.distributed_c10d._resolve_process_group",
            "c10d._world",
            "getattr(opts, '_timeout')",
        ]
    )


def instance_fields(class_source: str) -> set[str]:
    """The instance fields a class's methods assign (``self.x = ...``, ``self.x: T = ...``,
    ``self.x += ...``, ``self`` being a method's first parameter; static and class methods left
    out): torch's ``DeviceMesh.__init__`` sets fields that no class annotation names
    (``_coordinate_on_dim``, ``_dim_group_names``), and a torch may set one lazily elsewhere (older
    releases set ``_hash`` in ``__hash__`` only)."""
    cls = ast.parse(textwrap.dedent(class_source)).body[0]
    assert isinstance(cls, ast.ClassDef), "not the source of a class"
    found = set()
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef) or not fn.args.args:
            continue
        if any(isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod") for d in fn.decorator_list):
            continue
        me = fn.args.args[0].arg
        stores = [n for n in ast.walk(fn) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)]
        found |= {n.attr for n in stores if isinstance(n.value, ast.Name) and n.value.id == me}
    return found


def torch_fields() -> set[str]:
    """The instance fields of torch's ``DeviceMesh``: its class annotations and what its methods
    (``__init__`` above all) assign."""
    import inspect

    from torch.distributed.device_mesh import DeviceMesh

    return set(getattr(DeviceMesh, "__annotations__", {})) | instance_fields(inspect.getsource(DeviceMesh))


def checked_at_start_up() -> set[str]:
    """The private torch members the start-up self-check names (``rankmesh._torch_compat``'s lists),
    and the attributes rankmesh's patches replace, each recognised by its body (:mod:`rankmesh.patches`)."""
    from rankmesh import _mesh_check, patches

    checked = set(_mesh_check._REQUIRED_METHODS) | set(_mesh_check._REQUIRED_FIELDS) | set(_mesh_check._TENSOR_FIELDS)
    checked |= {f for f, _ in _mesh_check._READ_FIELDS}
    checked |= {"_preserve_rank_order"}  # HAS_PRESERVE_RANK_ORDER: set on every torch, read where it exists
    for patch in patches.REGISTRY.values():
        checked |= {patch.attribute} | {path.rsplit(".", 1)[-1] for path in patch.gate.paths}
    return checked


def private_members_named(tree: ast.AST, members: set[str]) -> set[str]:
    """The private ``members`` a module names: as attributes (``x._layout``), as strings (``d["_rank"]``,
    ``getattr(m, "_x")``) and as the names of functions it defines (an override)."""
    names = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    names |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    names |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    return {n for n in names if n.startswith("_") and not n.startswith("__") and n in members}


def torch_private_members() -> set[str]:
    """The private members of the torch classes whose objects rankmesh holds: ``DeviceMesh`` (its
    methods, annotated fields and the fields its methods set) and ``Tensor``."""
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    return set(dir(DeviceMesh)) | torch_fields() | set(dir(torch.Tensor))


def test_every_private_torch_member_rankmesh_names_is_checked_at_start_up():
    """What any module reads, sets or overrides of torch's DeviceMesh and Tensor (methods, annotated
    fields, the fields ``__init__`` and other methods set, ``Tensor._version``) is in the self-check's
    lists, or is an attribute a patch replaces after recognising its body."""
    members, checked = torch_private_members(), checked_at_start_up()
    used = {}
    for name, path in _modules().items():
        found = private_members_named(ast.parse(path.read_text(), str(path)), members)
        if found:
            used[name] = found
    assert {"_dim_group_names", "_layout", "_coordinate_on_dim", "_flatten_rank_map"} <= used["rankmesh.mesh"]
    assert "_version" in used["rankmesh._torch_compat"]
    unchecked = {name: sorted(found - checked) for name, found in used.items() if found - checked}
    assert not unchecked, unchecked


def test_the_member_check_finds_an_unchecked_one():
    src = "def f(t, m):\n    return t._version, m._flatten_rank_map, m._rm_world, getattr(m, '_pg_registry')\n"
    found = private_members_named(ast.parse(src), torch_private_members())
    assert found == {"_version", "_flatten_rank_map", "_pg_registry"}
    assert found - checked_at_start_up() == set()
    assert private_members_named(ast.parse("x._is_view()"), torch_private_members()) - checked_at_start_up() == {
        "_is_view"
    }


def fields_written(tree: ast.AST) -> set[str]:
    """The private fields a module writes on objects' ``__dict__`` (``d["_x"] = ...``,
    ``state["_x"] = ...``, ``.__dict__.setdefault("_x", ...)``, ``.__dict__.update(_x=...)``: every
    string-keyed store of a ``_``-name; rankmesh.mesh has no other dict keyed so), and the ones
    ``FastDeviceMesh``'s methods assign as ``self._x``."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Subscript) and isinstance(n.ctx, ast.Store) and isinstance(n.slice, ast.Constant):
            out.add(n.slice.value)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
            on_dict = _dotted(n.func.value).endswith("__dict__")
            if on_dict and n.func.attr == "setdefault" and n.args and isinstance(n.args[0], ast.Constant):
                out.add(n.args[0].value)
            elif on_dict and n.func.attr == "update":
                out |= {k.arg for k in n.keywords if k.arg}
        elif isinstance(n, ast.ClassDef) and n.name == "FastDeviceMesh":
            out |= {
                a.attr
                for a in ast.walk(n)
                if isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Store) and _dotted(a.value) == "self"
            }
    return {f for f in out if isinstance(f, str) and f.startswith("_") and not f.startswith("__")}


#: The fast mesh's own fields (rankmesh's layout and world), which torch never reads.
OWN_FIELD_PREFIX = "_rm_"


def unknown_fields(written: set[str], torch_has: set[str], preserve_rank_order: bool) -> set[str]:
    """The fields written that torch's ``DeviceMesh`` does not have: a torch that renamed one would
    read its own (unset or stale) field where rankmesh set the old name. ``_preserve_rank_order`` is
    set on every torch (2.13 has none; its pickles leave it out)."""
    allowed = torch_has | ({"_preserve_rank_order"} if not preserve_rank_order else set())
    return {f for f in written if not f.startswith(OWN_FIELD_PREFIX)} - allowed


def test_every_field_the_fast_meshes_write_is_a_field_of_torchs_devicemesh():
    from rankmesh import _torch_compat as compat

    written = fields_written(ast.parse((PACKAGE / "mesh.py").read_text()))
    assert {"_coordinate_on_dim", "_dim_group_names", "_hash", "_rm_world", "_pg_registry"} <= written
    unknown = unknown_fields(written, torch_fields(), compat.HAS_PRESERVE_RANK_ORDER)
    assert not unknown, f"rankmesh.mesh sets fields torch's DeviceMesh does not have: {sorted(unknown)}"


def test_the_field_check_finds_a_field_torch_renamed():
    torch_class = (
        "    class DeviceMesh:\n"
        "        _rank: int\n"
        "        def __init__(self, device_type, mesh=None):\n"
        "            self._device_type = device_type\n"
        "            self._coordinates: tuple | None = self._compute_coordinate_on_dim()\n"
        "            other._not_mine = 1\n"
        "        def __hash__(me):\n"
        "            me._hash = getattr(me, '_hash', None)\n"
        "        @staticmethod\n"
        "        def from_group(group):\n"
        "            group._not_a_field = 1\n"
    )
    assert instance_fields(torch_class) == {"_device_type", "_coordinates", "_hash"}
    mesh = (
        "class FastDeviceMesh(DeviceMesh):\n"
        "    def _make(self):\n"
        "        d = self.__dict__\n"
        "        d['_rm_world'] = world\n"
        "        d['_coordinate_on_dim'] = (0,)\n"
        "        self._thread_id = None\n"
        "        self.__dict__.update(_hash=None)\n"
        "        self.__dict__.setdefault('_pg_registry', {})\n"
        "        d['__weakref__'] = None\n"
    )
    written = fields_written(ast.parse(mesh))
    assert written == {"_rm_world", "_coordinate_on_dim", "_thread_id", "_hash", "_pg_registry"}
    fields = {"_device_type", "_coordinates", "_hash", "_thread_id", "_pg_registry"}
    assert unknown_fields(written, fields, preserve_rank_order=True) == {"_coordinate_on_dim"}
    with_order = written | {"_preserve_rank_order"}  # set on 2.13 too, where torch has no such field
    assert unknown_fields(with_order, fields, preserve_rank_order=False) == {"_coordinate_on_dim"}
    both = {"_coordinate_on_dim", "_preserve_rank_order"}  # 2.15+: the field must be torch's
    assert unknown_fields(with_order, fields, preserve_rank_order=True) == both


def test_the_fake_backend_is_registered_in_one_place():
    """Only rankmesh._fast_groups_check imports torch's fake backend (register_fake_backend, which
    init_fake_world calls too); docstring examples may, for the reader."""
    found = {}
    for name, path in _modules().items():
        tree = ast.parse(path.read_text(), str(path))
        mods = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        mods |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        if any("fake_pg" in m for m in mods):
            found[name] = sorted(m for m in mods if "fake_pg" in m)
    assert set(found) == {"rankmesh._fast_groups_check"}, found


# -- error kinds: one table (rankmesh.errors.ERROR_KINDS) --------------------------------------------


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""


def error_helper_positions(trees: list[ast.AST]) -> dict[str, dict[str, int]]:
    """For each helper named ``..._error`` defined in ``trees`` that takes ``kind`` or ``ctx`` as a
    positional parameter, that parameter's index among a call's positional arguments (a method's
    ``self`` or ``cls`` left out): a kind passed positionally is found as one passed by keyword."""
    out: dict[str, dict[str, int]] = {}
    for tree in trees:
        bound = {
            id(f)
            for c in ast.walk(tree)
            if isinstance(c, ast.ClassDef)
            for f in c.body
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in f.decorator_list)
        }
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.endswith("_error"):
                params = [a.arg for a in node.args.posonlyargs + node.args.args]
                if id(node) in bound:
                    params = params[1:]
                where = {p: params.index(p) for p in ("kind", "ctx") if p in params}
                if where:
                    out[node.name] = where
    return out


def error_kinds_used(
    tree: ast.AST, positions: dict[str, dict[str, int]] | None = None
) -> list[tuple[str, tuple[str, ...] | None]]:
    """``(kind, ctx keys)`` of every error built with a literal kind (``None`` for the keys when
    ``ctx`` is not a dict literal); an error class or a helper named ``_..._error``. The kind is
    ``kind=``, or, for a helper in ``positions`` (:func:`error_helper_positions`), the positional
    argument in its place."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _call_name(node)
        if not (name.endswith("Error") or name.endswith("_error")):
            continue
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        for param, index in (positions or {}).get(name, {}).items():
            if index < len(node.args) and not any(isinstance(a, ast.Starred) for a in node.args[: index + 1]):
                kw.setdefault(param, node.args[index])
        kind = kw.get("kind")
        if not (isinstance(kind, ast.Constant) and isinstance(kind.value, str)):
            continue
        ctx = kw.get("ctx")
        if ctx is None:
            keys: tuple[str, ...] | None = ()
        elif isinstance(ctx, ast.Dict) and all(isinstance(k, ast.Constant) for k in ctx.keys):
            keys = tuple(sorted(k.value for k in ctx.keys))
        else:
            keys = None
        found.append((kind.value, keys))
    return found


def test_every_error_kind_is_in_the_table_with_its_ctx_keys():
    from rankmesh.errors import ERROR_KINDS

    seen = set()
    wrong = {}
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in _modules().items()}
    positions = error_helper_positions(list(trees.values()))
    for name, tree in trees.items():
        for kind, keys in error_kinds_used(tree, positions):
            seen.add(kind)
            if kind not in ERROR_KINDS or keys != tuple(sorted(ERROR_KINDS[kind])):
                wrong.setdefault(name, []).append((kind, keys))
    assert not wrong, f"kinds missing from rankmesh.errors.ERROR_KINDS or with other ctx keys: {wrong}"
    assert not set(ERROR_KINDS) - seen, f"kinds in the table that nothing raises: {set(ERROR_KINDS) - seen}"


def test_the_error_kind_check_finds_them():
    src = (
        "raise SizeMismatchError('x', field='w', value=1, kind='world_not_divisible', ctx={'divisor': 2})\n"
        "raise _mesh_error(MeshArgumentError, 's', 'why', 'fix', kind='meshes_overlap')\n"
        "np.argsort(a, kind='stable')\n"
    )
    assert error_kinds_used(ast.parse(src)) == [("world_not_divisible", ("divisor",)), ("meshes_overlap", ())]


def test_the_error_kind_check_finds_a_kind_passed_positionally():
    """A helper that takes ``kind`` (or ``ctx``) positionally cannot hide a kind from the table."""
    src = (
        "def _mesh_error(cls, spec, why, fix, kind=None, ctx=None):\n"
        "    return cls(why, field='mesh', value=spec, kind=kind, ctx=ctx, fix=fix)\n"
        "class _Check:\n"
        "    def _degrees_error(self, fault, kind):\n"
        "        return fault\n"
        "raise _mesh_error(MeshArgumentError, 's', 'why', 'fix', 'mesh_syntax')\n"
        "raise _mesh_error(InvalidSizeError, 's', 'why', 'fix', 'empty_mesh', {'step': 0})\n"
        "raise self._degrees_error(fault, 'no_rank_left')\n"
        "raise _mesh_error(InvalidSizeError, 's', 'why', 'fix')\n"
    )
    tree = ast.parse(src)
    positions = error_helper_positions([tree])
    assert positions == {"_mesh_error": {"kind": 4, "ctx": 5}, "_degrees_error": {"kind": 1}}
    assert error_kinds_used(tree, positions) == [("mesh_syntax", ()), ("empty_mesh", ("step",)), ("no_rank_left", ())]
    assert error_kinds_used(tree) == []  # what the check saw before it read the helpers' parameters


def renamed(field: str) -> type:
    """torch's ``DeviceMesh`` as a torch that renamed ``field`` would have it: its annotations and
    the code of each of its methods say ``<field>_renamed`` instead."""
    import types

    from torch.distributed.device_mesh import DeviceMesh

    def rename(fn: types.FunctionType) -> types.FunctionType:
        names = tuple(f"{n}_renamed" if n == field else n for n in fn.__code__.co_names)
        new = types.FunctionType(fn.__code__.replace(co_names=names), fn.__globals__, fn.__name__, fn.__defaults__)
        new.__kwdefaults__ = fn.__kwdefaults__
        return new

    ns = {n: rename(v) for n, v in vars(DeviceMesh).items() if isinstance(v, types.FunctionType) and not v.__closure__}
    ns["__annotations__"] = {f"{k}_renamed" if k == field else k: v for k, v in DeviceMesh.__annotations__.items()}
    return type("DeviceMesh", (DeviceMesh,), ns)


def test_a_torch_that_renamed_a_field_rankmesh_writes_fails_the_self_check(monkeypatch):
    """rankmesh's meshes set torch's fields from precomputed state; a torch that renamed one would
    read its own field, unset or stale, where rankmesh set the old name. Every field mesh.py writes
    (but ``_preserve_rank_order``, set on every torch and read only where it exists) is named by the
    start-up self-check, which refuses such a torch."""
    from rankmesh import _mesh_check

    written = fields_written(ast.parse((PACKAGE / "mesh.py").read_text()))
    torchs = {f for f in written if not f.startswith(OWN_FIELD_PREFIX)} - {"_preserve_rank_order"}
    assert {"_coordinate_on_dim", "_dim_group_names", "_flatten_rank_map", "_hash", "_layout"} <= torchs
    assert _mesh_check._self_check() is None
    for field in sorted(torchs):
        monkeypatch.setattr(_mesh_check, "DeviceMesh", renamed(field))
        reason = _mesh_check._self_check()
        assert reason is not None and field in reason, (field, reason)


# -- placement arithmetic lives in the core ---------------------------------------------------------

#: Names that hold a mode's stride or a range's step: arithmetic with them (``size * stride``,
#: ``x // stride``, ``x % step``) is placement algebra, which ``rankmesh.Slice`` / ``MeshLayout``
#: (the Rust core) own.
_MODE_PARTS = {"stride", "strides", "step"}


def _placement_arithmetic(source: str) -> list[str]:
    """``line: what`` for each piece of placement arithmetic in ``source``, in line order: a gcd or
    lcm or a modular inverse (three-argument ``pow``) of strides or steps, or ``*``, ``//`` or ``%``
    with a stride or step as an operand."""

    def part(node: ast.AST) -> str | None:
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        return name if name in _MODE_PARTS else None

    def mentions_part(node: ast.AST) -> bool:
        return any(part(n) for n in ast.walk(node))

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            name = _dotted(node.func).rsplit(".", 1)[-1]
            if (name in ("gcd", "lcm") or (name == "pow" and len(node.args) == 3)) and mentions_part(node):
                found.append(f"{node.lineno}: {name}()")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mult, ast.FloorDiv, ast.Mod)):
            if part(node.right) or part(node.left):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda f: int(f.split(":")[0]))


def test_no_placement_arithmetic_outside_the_core():
    """Which ranks an offset plus (size, stride) modes hold, where two such sets meet, whether one
    holds the other, which layout a list of ranks is: one value in the core (``rankmesh.Slice``,
    ``MeshLayout``), not redone in Python modules."""
    found = {
        name: hits
        for name, path in _modules().items()
        if not _in_bench(name) and (hits := _placement_arithmetic(path.read_text()))
    }
    assert not found, f"placement arithmetic outside the core (call rankmesh.Slice / MeshLayout): {found}"


def test_the_placement_check_finds_it():
    source = textwrap.dedent(
        """
        import math
        def nodes(world, gpus):
            return math.gcd(world, gpus)  # not placement: no stride or step
        def first_shared(a, b):
            g = math.gcd(a.step, b.step)
            t = pow(a.step // g, -1, b.step)
            return [r for size, stride in modes for r in range(0, size * stride, stride)]
        def digit(i, m):
            return i // m.stride % m.size
        """
    )
    found = _placement_arithmetic(source)
    assert [f.split(":")[0] for f in found] == ["6", "7", "7", "8", "10"], found


# -- messages are templates: the CLI renders them, it parses no prose -------------------------------


def test_the_cli_parses_no_prose():
    """``rankmesh plan`` prints an API error's message with its flags by rendering the message's
    template (``RankmeshError.render`` over :func:`rankmesh.errors.arg` marks), never by matching
    the message text: the CLI module does not import ``re``."""
    imported = set()
    for node in ast.walk(ast.parse(_modules()["rankmesh.cli"].read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    assert "re" not in imported, "rankmesh.cli matches message text; mark the argument with errors.arg instead"


def test_argument_marks_never_reach_a_message():
    from rankmesh.errors import InvalidSizeError, arg

    e = InvalidSizeError(f"{arg('tp', 'tp = 0', 0)} and {arg('world_size')} {{braces}} stay", field="tp", value=0)
    assert str(e) == e.message == e.args[0] == "tp = 0 and world_size {braces} stay"
    assert e.render(lambda name, value: f"--{name.replace('_', '-')}") == "--tp 0 and --world-size {braces} stay"
    import pickle

    again = pickle.loads(pickle.dumps(e))
    assert str(again) == str(e) and again.render(lambda n, v: "--x") == "--x 0 and --x {braces} stay"
