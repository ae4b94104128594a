"""``durable check``: a determinism lint for workflow code.

Workflow code is replayed: after a crash or a deploy a worker runs ``handle()``
again from the start and expects it to make the same durable calls in the same
order. A call that reads the wall clock, randomness, the environment, the
network or files, or that starts threads, can answer differently on replay and
break the run. This module parses (``ast``) the source of every ``Workflow``
subclass defined in the app modules — ``handle()``, signal and query handlers,
helper methods, lambdas passed to ``all()`` — and reports such calls with the
durable alternative.

It is a lint, not a proof: it sees calls written in the class body, not what
the functions they call do, and it cannot see through a name rebound at run
time. Silence one line with a ``# durable: ignore`` comment.
"""

from __future__ import annotations

import ast
import inspect
import sys
import sysconfig
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from durable import Workflow

IGNORE_COMMENT = "durable: ignore"

#: (category, what to use instead) by dotted name; a name ending in ``.*`` covers a whole module.
_RULES: dict[str, tuple[str, str]] = {}


def _rule(names: Iterable[str], category: str, fix: str) -> None:
    for name in names:
        _RULES[name] = (category, fix)


_rule(
    [
        "time.time",
        "time.time_ns",
        "time.monotonic",
        "time.monotonic_ns",
        "time.perf_counter",
        "time.perf_counter_ns",
        "time.process_time",
        "time.localtime",
        "time.gmtime",
        "time.ctime",
        "time.asctime",
        "time.strftime",
        "datetime.datetime.now",
        "datetime.datetime.utcnow",
        "datetime.datetime.today",
        "datetime.date.today",
    ],
    "wall clock",
    "durable.now() (the time of the last applied event)",
)
_rule(["time.sleep"], "sleep", "durable.timer(seconds) (a durable timer; no worker is held)")
_rule(["random.*", "numpy.random.*"], "randomness", "durable.random(), or side_effect(lambda: ...)")
_rule(["secrets.*", "os.urandom", "os.getrandom"], "randomness", "side_effect(lambda: ...)")
_rule(["uuid.uuid1", "uuid.uuid4"], "randomness", "durable.uuid4()")
_rule(
    ["os.getenv", "os.environ", "os.environ.*", "os.getenvb", "os.environb"],
    "environment",
    "pass configuration as a workflow argument, or read it in an activity",
)
_rule(
    [
        "requests.*",
        "httpx.*",
        "aiohttp.*",
        "urllib.request.*",
        "urllib3.*",
        "http.client.*",
        "socket.*",
        "smtplib.*",
        "redis.*",
    ],
    "network",
    "an activity (retried, recorded once)",
)
_rule(
    [
        "open",
        "io.open",
        "os.open",
        "os.listdir",
        "os.scandir",
        "os.remove",
        "os.unlink",
        "os.rename",
        "os.makedirs",
        "os.mkdir",
        "os.stat",
        "os.path.exists",
        "os.path.isfile",
        "os.path.isdir",
        "os.path.getmtime",
        "os.path.getsize",
        "shutil.*",
        "glob.*",
        "tempfile.*",
        "pathlib.Path.*",
        ".read_text",
        ".write_text",
        ".read_bytes",
        ".write_bytes",
    ],
    "file I/O",
    "an activity (files differ between workers and between replays)",
)
_rule(
    [
        "threading.*",
        "concurrent.futures.*",
        "asyncio.*",
        "multiprocessing.*",
        "subprocess.*",
        "os.system",
        "os.fork",
        "os.popen",
    ],
    "threads/processes",
    "durable.all([...]) for concurrency; an activity for processes",
)
_rule(["input"], "console input", "a signal (durable.await_signal) or a workflow argument")


@dataclass(frozen=True)
class Finding:
    """One call that can break replay."""

    path: str
    line: int
    col: int
    workflow: str
    method: str
    call: str
    category: str
    fix: str

    @property
    def location(self) -> str:
        return f"{self.path}:{self.line}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- name resolution


def _imports(tree: ast.Module, package: str = "") -> dict[str, str]:
    """Local name -> dotted origin, from the module's imports (``import x as y``, ``from a import
    b``; ``from .models import b`` too, given the module's ``package``)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".", 1)[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom):
            origin = _absolute(node, package)
            for alias in node.names if origin else ():
                names[alias.asname or alias.name] = f"{origin}.{alias.name}"
    return names


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from ... import`` names, made absolute (``""``: a relative one with no
    package known)."""
    if node.level == 0:
        return node.module or ""
    parts = package.split(".") if package else []
    if not parts or node.level - 1 > len(parts):
        return ""
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


def _dotted(node: ast.AST) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    if isinstance(node, ast.Call):  # Path("x").read_text(): keep the method name
        inner = _dotted(node.func)
        if inner is not None:
            return [*inner, "()", *parts[::-1]]
    return None


def _resolve(node: ast.AST, imports: dict[str, str]) -> str | None:
    parts = _dotted(node)
    if not parts:
        return None
    head = imports.get(parts[0])
    if head is None:
        # a builtin (open, input) or a local/attribute; keep the text
        return ".".join(parts)
    return ".".join([head, *parts[1:]])


def _match(name: str, *, is_call: bool) -> tuple[str, str, str] | None:
    """(matched rule, category, fix) for a resolved dotted name."""
    clean = name.replace(".()", "")
    candidates = [clean]
    pieces = clean.split(".")
    for i in range(len(pieces) - 1, 0, -1):
        candidates.append(".".join(pieces[:i]) + ".*")
    for candidate in candidates:
        rule = _RULES.get(candidate)
        if rule is not None:
            return candidate, *rule
    if is_call and len(pieces) > 1:
        rule = _RULES.get("." + pieces[-1])
        if rule is not None and pieces[0] not in ("durable", "self"):
            return "." + pieces[-1], *rule
    return None


# --------------------------------------------------------------------------- read-only handlers

#: Methods that change the object they are called on (a list, dict or set held in ``self``).
_MUTATORS = frozenset(
    ("append", "extend", "insert", "pop", "remove", "clear", "update", "add", "discard")
    + ("setdefault", "popitem", "sort", "reverse")
)
_READ_ONLY_FIX = {
    "validator": "change it in the @update handler: a validator runs only when the update arrives, "
    "never on replay, so a restarted worker's state would differ (read state here, raise to reject)",
    "query": "change it in handle() or a @signal/@update handler: a query runs only when asked, "
    "never on replay, so a restarted worker's state would differ",
}


def _read_only_kind(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """``"validator"`` (``@<update>.validator``), ``"query"`` (``@query``), else ``""``."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr == "validator":
            return "validator"
        parts = _dotted(target) or []
        if parts and parts[-1] == "query":
            return "query"
    return ""


def _on_self(node: ast.AST) -> bool:
    """Whether ``node`` is ``self.x`` (or ``self.x[k]``, ``self.x.y``)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
        if isinstance(node, ast.Name):
            return node.id == "self"
    return False


# --------------------------------------------------------------------------- checking


class _Visitor(ast.NodeVisitor):
    def __init__(
        self,
        path: str,
        workflow: str,
        imports: dict[str, str],
        lines: Sequence[str],
        patches: tuple[str, ...] | None = None,
        factories: Mapping[str, list[tuple[str, str, str, str]]] | None = None,
    ) -> None:
        self.path = path
        self.factories = factories or {}  # models whose fields default to a clock or randomness
        self.workflow = workflow
        self.imports = imports
        self.lines = lines
        self.patches = patches  # the class's Workflow.patches (None: not known, not checked)
        self.method = ""
        self.read_only = ""  # the method is a validator or a query: it must not change state
        self.findings: list[Finding] = []
        self._seen: set[tuple[int, int]] = set()

    def _report(self, node: ast.AST, name: str, category: str, fix: str) -> None:
        line = getattr(node, "lineno", 0)
        col = getattr(node, "col_offset", 0)
        if (line, col) in self._seen:
            return
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        if IGNORE_COMMENT in text:
            return
        self._seen.add((line, col))
        self.findings.append(
            Finding(
                self.path, line, col, self.workflow, self.method, name.replace(".()", "()"), category, fix
            )
        )

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer, outer_kind = self.method, self.read_only
        if not outer:
            self.method, self.read_only = node.name, _read_only_kind(node)
        self.generic_visit(node)
        self.method, self.read_only = outer, outer_kind

    def _changes_state(self, node: ast.AST, what: str) -> None:
        if self.read_only:
            self._report(node, what, f"{self.read_only} changes state", _READ_ONLY_FIX[self.read_only])

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            for name in ast.walk(target):
                if isinstance(name, (ast.Attribute, ast.Subscript)) and _on_self(name):
                    self._changes_state(node, ast.unparse(name) + " = ...")
                    break
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if _on_self(node.target):
            self._changes_state(node, ast.unparse(node.target) + " = ...")
        self.generic_visit(node)

    visit_AnnAssign = visit_AugAssign  # type: ignore[assignment]

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            if _on_self(target):
                self._changes_state(node, "del " + ast.unparse(target))
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _MUTATORS and _on_self(func.value):
            self._changes_state(node, ast.unparse(func) + "()")
        name = _resolve(node.func, self.imports)
        if name is not None:
            hit = _match(name, is_call=True)
            if hit is not None:
                self._report(node, name + "()", hit[1], hit[2])
            self._check_factories(node, name)
        if name in ("durable.patched", "durable.workflow.patched"):
            self._check_patch(node)
        if name == "durable.side_effect" or (name or "").endswith("workflow.side_effect"):
            # side_effect(fn) records fn's value once: fn may read clocks and randomness.
            self.visit(node.func)
            for arg in [*node.args[1:], *node.keywords]:
                self.visit(arg)
            return
        self.generic_visit(node)

    def _check_factories(self, node: ast.Call, name: str) -> None:
        """A model built in workflow code whose fields default to ``uuid4``, ``datetime.now``...:
        its ``default_factory`` runs again at every replay, and gives another value each time."""
        left = [
            (field, call, category, fix)
            for field, call, category, fix in self.factories.get(name, ())
            if field not in {kw.arg for kw in node.keywords}
        ]
        if not left or any(kw.arg is None for kw in node.keywords):  # **values: may pass them
            return
        fields = ", ".join(f"{field} (default_factory {call})" for field, call, _, _ in left)
        self._report(
            node,
            f"{ast.unparse(node.func)}() leaves {fields}",
            left[0][2],
            f"pass {', '.join(f'{field}=' for field, *_ in left)} in the call ({left[0][3]}): the "
            "factory runs again at every replay and gives another value",
        )

    def _check_patch(self, node: ast.Call) -> None:
        """``patched("x")`` with ``x`` not in the class's ``patches`` answers False in every run."""
        arg = node.args[0] if node.args else None
        if self.patches is None or not isinstance(arg, ast.Constant) or not isinstance(arg.value, str):
            return
        if arg.value not in self.patches:
            self._report(
                node,
                f"patched({arg.value!r})",
                "undeclared patch",
                f"add {arg.value!r} to the class's `patches` (it declares {self.patches!r}): "
                "undeclared, no run takes the patched branch (the run is blocked when it gets there)",
            )

    def visit_Name(self, node: ast.Name) -> None:
        # `from os import environ` then environ["X"]
        if self.imports.get(node.id) in ("os.environ", "os.environb"):
            name = self.imports[node.id]
            self._report(node, name, *_RULES[name])

    def visit_Attribute(self, node: ast.Attribute) -> None:
        # os.environ["X"], os.environ.get("X"): the attribute itself is the read.
        name = _resolve(node, self.imports)
        if name in ("os.environ", "os.environb"):
            self._report(node, name, *_RULES[name])
            return
        self.generic_visit(node)


def factory_fields(
    source: str, module: str = "", package: str = ""
) -> dict[str, list[tuple[str, str, str, str]]]:
    """The classes of a module's source (dataclasses, pydantic models) with fields whose
    ``default_factory`` reads a clock or randomness: ``{name: [(field, call, category, fix)]}``,
    by the class's name, or given ``module``, its dotted name (as another module imports it);
    ``package``: the module's, for its relative imports."""
    tree = ast.parse(source)
    imports = _imports(tree, package)
    out: dict[str, list[tuple[str, str, str, str]]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        found = []
        for item in node.body:
            target = item.target if isinstance(item, ast.AnnAssign) else None
            value = item.value if isinstance(item, ast.AnnAssign) else None
            if isinstance(target, ast.Name) and isinstance(value, ast.Call):
                for kw in value.keywords:
                    hit = _factory_rule(kw.value, imports) if kw.arg == "default_factory" else None
                    if hit is not None:
                        found.append((target.id, *hit))
        if found:
            out[f"{module}.{node.name}" if module else node.name] = found
    return out


def _factory_rule(node: ast.AST, imports: dict[str, str]) -> tuple[str, str, str] | None:
    """``(call, category, fix)`` of a ``default_factory`` value that is (or, a lambda, calls) a
    clock or randomness; ``None``: it is not."""
    calls = (
        [sub.func for sub in ast.walk(node.body) if isinstance(sub, ast.Call)]
        if isinstance(node, ast.Lambda)
        else [node]
    )
    for call in calls:
        name = _resolve(call, imports)
        hit = _match(name, is_call=True) if name is not None else None
        if name is not None and hit is not None:
            return name + "()", hit[1], hit[2]
    return None


def check_source(
    source: str,
    path: str,
    workflow_names: Iterable[str] | None = None,
    patches_of: Mapping[str, tuple[str, ...]] | None = None,
    factories: Mapping[str, list[tuple[str, str, str, str]]] | None = None,
    package: str = "",
) -> list[Finding]:
    """Lint the classes of a module's source; ``workflow_names``: only these classes (default:
    all); ``patches_of``: their ``Workflow.patches`` by name, to check ``patched()`` calls;
    ``factories``: :func:`factory_fields` of the app's modules (default: this source's);
    ``package``: the module's, for its relative imports (``from .models import Order``)."""
    tree = ast.parse(source, filename=path)
    imports = _imports(tree, package)
    lines = source.splitlines()
    wanted = set(workflow_names) if workflow_names is not None else None
    factories = factories if factories is not None else factory_fields(source, package=package)
    findings: list[Finding] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and (wanted is None or node.name in wanted):
            visitor = _Visitor(path, node.name, imports, lines, (patches_of or {}).get(node.name), factories)
            for item in node.body:
                visitor.visit(item)
            findings += visitor.findings
    return sorted(findings, key=lambda f: (f.path, f.line, f.col))


def _workflow_classes(module: ModuleType) -> list[str]:
    names = []
    for attr, value in vars(module).items():
        if (
            inspect.isclass(value)
            and issubclass(value, Workflow)
            and value is not Workflow
            and value.__module__ == module.__name__
            and value.__qualname__ == attr
        ):
            names.append(attr)
    return names


def app_modules(modules: Sequence[ModuleType]) -> list[ModuleType]:
    """The given modules plus their already imported submodules (a package's workflows)."""
    out: dict[str, ModuleType] = {m.__name__: m for m in modules}
    prefixes = tuple(m.__name__ + "." for m in modules if hasattr(m, "__path__"))
    if prefixes:
        for name, module in list(sys.modules.items()):
            if module is not None and name.startswith(prefixes):
                out.setdefault(name, module)
    return list(out.values())


def check_modules(modules: Sequence[ModuleType]) -> tuple[list[Finding], int]:
    """Lint the Workflow subclasses defined in ``modules``: ``(findings, classes checked)``."""
    findings: list[Finding] = []
    classes = 0
    sources = {m: _source(m) for m in app_modules(modules)}
    factories: dict[str, list[tuple[str, str, str, str]]] = {}
    for module, (_, source) in {**sources, **_imported(sources)}.items():
        factories |= factory_fields(source, module.__name__, _package(module)) if source else {}
    for module, (path, source) in sources.items():
        names = _workflow_classes(module)
        if not names or not source:
            continue
        classes += len(names)
        patches = {name: tuple(getattr(module, name).patches) for name in names}
        prefix = module.__name__ + "."  # its own classes, by the bare names its code calls them
        own = factories | {k.removeprefix(prefix): v for k, v in factories.items() if k.startswith(prefix)}
        findings += check_source(source, _display_path(path), names, patches, own, _package(module))
    return findings, classes


def _package(module: ModuleType) -> str:
    """The package a module's relative imports start from."""
    return module.__package__ or (module.__name__ if hasattr(module, "__path__") else "")


def _imported(sources: Mapping[ModuleType, tuple[str, str]]) -> dict[ModuleType, tuple[str, str]]:
    """The project's own modules the app's sources import (models often live apart from the
    workflows): loaded, and not the standard library's nor an installed package's."""
    installed = {sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    out: dict[ModuleType, tuple[str, str]] = {}
    for module, (_, source) in sources.items():
        for origin in _imports(ast.parse(source), _package(module)).values() if source else ():
            found = _loaded(origin)
            if found is None or found in out or found.__name__.split(".")[0] in ("durable", "workers"):
                continue
            path, text = _source(found)
            if path and not any(Path(path).is_relative_to(root) for root in installed):
                out[found] = (path, text)
    return out


def _loaded(origin: str) -> ModuleType | None:
    """The loaded module a dotted import origin names (``pkg.models.Order``: ``pkg.models``)."""
    pieces = origin.split(".")
    for i in range(len(pieces), 0, -1):
        module = sys.modules.get(".".join(pieces[:i]))
        if module is not None:
            return module
    return None


def _source(module: ModuleType) -> tuple[str, str]:
    """``(path, source)`` of a module (``""``: none readable, a compiled or built-in one)."""
    try:
        path = inspect.getsourcefile(module)
        return (path, Path(path).read_text()) if path else ("", "")
    except (OSError, TypeError, UnicodeDecodeError):
        return "", ""


def _display_path(path: str) -> str:
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path


def findings_table(findings: Sequence[Finding]) -> Any:
    """A rich table of findings."""
    from rich.table import Table

    table = Table(title=f"determinism problems ({len(findings)})", title_justify="left")
    table.add_column("location", no_wrap=True)
    table.add_column("workflow", no_wrap=True)
    table.add_column("call", overflow="fold")
    table.add_column("problem", no_wrap=True)
    table.add_column("use instead", overflow="fold")
    for f in findings:
        table.add_row(
            f.location, f"{f.workflow}.{f.method}" if f.method else f.workflow, f.call, f.category, f.fix
        )
    return table
