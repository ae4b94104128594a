"""Generate docs/api.md from the docstrings of everything in ``durable.__all__``.

    python docs/gen_api.py           # rewrite docs/api.md
    python docs/gen_api.py --check   # exit 1 if docs/api.md is out of date

tests/test_docs.py runs the check, so api.md stays in sync with the code.
"""

from __future__ import annotations

import inspect
import sys
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "api.md"

SECTIONS = [
    (
        "Workflow code",
        "Called inside `Workflow.handle()` (or a branch of `all()`); each is recorded in history.",
    ),
    ("Activities", "Activity definitions and what a running activity can see."),
    ("Client", "Starting, signalling, querying and awaiting runs from ordinary code."),
    (
        "Errors",
        "`DurableError` is the root of every error; `CancelledError` alone derives from `BaseException`.",
    ),
    ("Constants", ""),
]


def _section(name: str, obj: Any) -> str:
    if isinstance(obj, type) and issubclass(obj, BaseException):
        return "Errors"
    if not callable(obj):
        return "Constants"
    module = getattr(obj, "__module__", "")
    if module.endswith((".client", ".runinfo", ".blocked")):
        return "Client"
    if module.endswith((".activity", ".registry", ".options")):
        return "Activities"
    return "Workflow code"


def _summary(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    paragraphs = [p.strip() for p in doc.split("\n\n") if p.strip()]
    if not paragraphs:
        return "(no docstring)"
    first = " ".join(line.strip() for line in paragraphs[0].splitlines())
    rest = []
    for para in paragraphs[1:]:
        head = para.splitlines()[0].strip()
        if head.endswith(":") and head[:-1] in (
            "Args",
            "Raises",
            "Returns",
            "Attributes",
            "Class attributes",
        ):
            rest.append(para)
    return first + ("\n\n" + "\n\n".join(_fence_sections(rest)) if rest else "")


def _fence_sections(paragraphs: list[str]) -> list[str]:
    out = []
    for para in paragraphs:
        lines = para.splitlines()
        head, body = lines[0].strip(), [line for line in lines[1:] if line.strip()]
        base = min((len(line) - len(line.lstrip()) for line in body), default=0)
        items: list[str] = []
        for line in body:
            indent = len(line) - len(line.lstrip())
            text = line.strip()
            if items and (indent > base or items[-1].endswith(",")):
                items[-1] += " " + text
            else:
                items.append(text)
        out.append(f"*{head}*\n\n" + "\n".join(f"- {item}" for item in items))
    return out


class _Annotation:
    """Shows a string annotation without quotes (``from __future__ import annotations``)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _signature(name: str, obj: Any) -> str:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return name
    params = [
        p.replace(annotation=_Annotation(p.annotation)) if isinstance(p.annotation, str) else p
        for p in sig.parameters.values()
    ]
    ret = sig.return_annotation
    sig = sig.replace(parameters=params, return_annotation=_Annotation(ret) if isinstance(ret, str) else ret)
    return f"{name}{sig}"


def _members(cls: type) -> list[tuple[str, Any]]:
    out = []
    for attr, value in vars(cls).items():
        if attr.startswith("_"):
            continue
        if isinstance(value, staticmethod | classmethod):
            value = value.__func__
        if isinstance(value, property) or inspect.isfunction(value):
            out.append((attr, value))
    return out


def render() -> str:
    import durable

    grouped: dict[str, list[str]] = {title: [] for title, _ in SECTIONS}
    for name in sorted(durable.__all__, key=str.lower):
        obj = getattr(durable, name)
        lines = [f"### {name}", ""]
        if isinstance(obj, type):
            bases = ", ".join(b.__name__ for b in obj.__bases__ if b is not object)
            lines += ["```python", f"class {name}" + (f"({bases})" if bases else ""), "```", ""]
            init = obj.__dict__.get("__init__")
            if init is not None and not issubclass(obj, BaseException) and name != "Workflow":
                lines += [
                    "```python",
                    _signature(name, init).replace("(self, ", "(").replace("(self)", "()"),
                    "```",
                    "",
                ]
        elif callable(obj):
            lines += ["```python", _signature(name, obj), "```", ""]
        else:
            lines += ["```python", f"{name} = {obj!r}", "```", ""]
        if callable(obj):
            lines += [_summary(obj), ""]
        if isinstance(obj, type) and not issubclass(obj, BaseException):
            members = _members(obj)
            if members:
                lines += ["Members:", ""]
                for attr, value in members:
                    if isinstance(value, property):
                        doc = _first_line(value.fget)
                        lines.append(f"- `{attr}` (property) — {doc}")
                    else:
                        function = value.__func__ if isinstance(value, classmethod | staticmethod) else value
                        # Typed overloads say what a caller gets (make(Order) -> WorkflowStub[Order]);
                        # the implementation's signature only its widest types.
                        shapes = typing.get_overloads(function) or [value]
                        for i, shape in enumerate(shapes):
                            if isinstance(shape, classmethod | staticmethod):
                                shape = shape.__func__
                            sig = _signature(attr, shape).replace("(self, ", "(").replace("(self)", "()")
                            sig = sig.replace("(cls, ", "(").replace("(cls)", "()")
                            if inspect.iscoroutinefunction(function):
                                sig = f"async {sig}"  # awaited: say so, the signature does not
                            lines.append(f"- `{sig}`" + (f" — {_first_line(value)}" if i == 0 else ""))
                lines.append("")
        grouped[_section(name, obj)] += lines
    out = [
        "# API reference",
        "",
        "<!-- Generated by docs/gen_api.py from the docstrings; do not edit by hand. -->",
        "",
        "Everything in `durable.__all__`, i.e. everything importable with `from durable import ...`.",
        "Other modules are machinery, except `durable.testing` (see [guide.md](guide.md#testing)).",
        "",
    ]
    for title, intro in SECTIONS:
        if not grouped[title]:
            continue
        out += [f"## {title}", ""]
        if intro:
            out += [intro, ""]
        out += grouped[title]
    return "\n".join(out).rstrip() + "\n"


def _first_line(obj: Any) -> str:
    doc = inspect.getdoc(obj) or ""
    first = doc.split("\n\n")[0]
    return " ".join(line.strip() for line in first.splitlines()) or "(no docstring)"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run python docs/gen_api.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
