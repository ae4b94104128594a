"""Arguments converted by their declared types: pydantic models (and dataclasses) from plain values.

A handler (``Workflow.handle``, a ``@signal``/``@update``/``@query`` method, an activity)
whose parameter is annotated with a pydantic model (or a type containing one:
``Order | None``, ``list[Item]``, ``dict[str, Item]``) gets a model even when the caller
passed a plain ``dict`` (a JSON body, the CLI, the HTTP API), validated by pydantic; a
validation error names the handler, the parameter and each offending field. A parameter
annotated with a dataclass (or one or ``None``) given a ``dict`` gets the dataclass, built
and validated the same way (an instance passes as it came). Parameters annotated otherwise
are passed as they come (no coercion). Without pydantic nothing changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import json
import logging
import sys
import typing
from collections.abc import Callable
from typing import Any

from .codec.models import field_errors, is_model_class
from .errors import ConfigurationError, SerializationError

log = logging.getLogger("durable")

#: (parameter name, pydantic TypeAdapter, the dataclass when only a dict is converted, else None)
#: by position; None where no conversion applies.
Converters = list[tuple[str, Any, type | None] | None]


def _mentions_model(annotation: Any) -> bool:
    if is_model_class(annotation):
        return True
    return any(_mentions_model(arg) for arg in typing.get_args(annotation))


def _a_dataclass(annotation: Any) -> type | None:
    """The dataclass ``annotation`` is (or one or ``None``), else None: a dict given for it (a
    JSON body, ``durable start``) is built into one. An instance passes as it came, as before."""
    options = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if len(options) == 1 and dataclasses.is_dataclass(options[0]) and isinstance(options[0], type):
        return options[0]
    return None


_resolved: dict[tuple[Callable[..., Any], int], Converters | None] = {}


def converters(fn: Callable[..., Any], skip: int) -> Converters | None:
    """:func:`resolve`, remembered; an annotation that cannot be resolved at the first call
    (a ``TYPE_CHECKING`` import) means no conversion, as before models existed."""
    key = (fn, skip)
    if key not in _resolved:
        try:
            _resolved[key] = resolve(fn, skip)
        except Exception as exc:  # noqa: BLE001 - unresolvable annotations: the arguments pass as they come
            _resolved[key] = None
            if sys.modules.get("pydantic") is not None:  # said once: a model would have been converted
                log.warning(
                    "the annotations of %s cannot be resolved (%s: %s): its arguments pass as they come, "
                    "a dict is not converted to a model; import the annotated types at module level, "
                    "not under TYPE_CHECKING",
                    getattr(fn, "__qualname__", fn),
                    type(exc).__name__,
                    exc,
                )
    return _resolved[key]


def resolve(fn: Callable[..., Any], skip: int) -> Converters | None:
    """Per positional parameter of ``fn`` (after the first ``skip``), how to convert an
    argument; ``None`` when no parameter mentions a model (the common case: nothing to do).

    Raises:
        NameError: an annotation cannot be resolved yet (a forward reference).
    """
    pydantic: Any = sys.modules.get("pydantic")
    hints = typing.get_type_hints(fn)
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ][skip:]
    if pydantic is None:  # no model can be given; a dataclass can, from a dict, if pydantic is there
        if not any(_a_dataclass(hints.get(p.name)) for p in params):
            return None
        try:
            pydantic = importlib.import_module("pydantic")  # only for handlers taking dataclasses
        except ImportError:
            return None
    found: Converters = []
    for param in params:
        hint = hints.get(param.name)
        if _mentions_model(hint) or _a_dataclass(hint):
            only_dict = None if _mentions_model(hint) else _a_dataclass(hint)
            found.append((param.name, pydantic.TypeAdapter(hint), only_dict))
        else:
            found.append(None)
    return found if any(found) else None


def convert(
    fn: Callable[..., Any], args: tuple[Any, ...], what: str, *, skip: int = 0, strict: bool = False
) -> tuple[Any, ...]:
    """``args`` for ``fn`` with each model-annotated argument validated into its type.
    ``strict`` (a client checking a start): a dataclass-annotated argument that is neither a
    dict nor an instance is refused too (a run would fail on it later, or retry for ever).

    Raises:
        SerializationError: an argument does not validate (naming ``what``, the parameter
            and the fields).
    """
    found = converters(fn, skip)
    if found is None:
        return args
    pydantic = sys.modules["pydantic"]
    out = list(args)
    for i, (value, conv) in enumerate(zip(args, found, strict=False)):
        if conv is not None and conv[2] is not None and not isinstance(value, dict):
            if strict and value is not None and not isinstance(value, conv[2]):
                raise SerializationError(
                    f"{what}: argument {conv[0]!r} is invalid: expected a {conv[2].__name__} or a dict "
                    f"of its fields, got {type(value).__name__}",
                    path=f"args[{i}]",
                )
            continue
        if conv is None:
            continue
        name, adapter, _ = conv
        try:
            out[i] = _validated(adapter, value, pydantic.ValidationError)
        except pydantic.ValidationError as exc:
            raise SerializationError(
                f"{what}: argument {name!r} is invalid: {field_errors(exc)}", path=f"args[{i}]"
            ) from None
    return tuple(out)


def _validated(adapter: Any, value: Any, invalid: type[Exception]) -> Any:
    """``value`` validated by ``adapter``; plain data (a JSON body, CLI arguments) that python
    mode refuses is read as the JSON it is: a strict model takes ``"2026-01-01T00:00:00Z"``
    for a datetime only from JSON, as it does when the codec rebuilds one."""
    try:
        return adapter.validate_python(value)
    except invalid as refused:
        try:
            text = json.dumps(value, allow_nan=False)
        except (TypeError, ValueError):  # not plain data: python mode's verdict stands
            raise refused from None
        return adapter.validate_json(text)


def typed_method(cls: type, attr: str, what: str) -> None:
    """Make ``cls.attr`` (a method defined on ``cls``) convert its arguments, if any
    parameter mentions a model. Resolved now when possible, else at the first call."""
    fn = cls.__dict__.get(attr)
    if not inspect.isfunction(fn) or getattr(fn, "__durable_typed__", False):
        return
    try:
        if resolve(fn, 1) is None:
            return
    except NameError:
        pass  # a forward reference: resolved at the first call
    except Exception:  # noqa: BLE001 - annotations pydantic cannot type: leave the method alone
        return

    @functools.wraps(fn)
    def typed(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(self, *convert(fn, args, what, skip=1), **kwargs)

    typed.__durable_typed__ = True  # type: ignore[attr-defined]
    typed.__durable_what__ = what  # type: ignore[attr-defined]
    setattr(cls, attr, typed)


def prepared(method: Callable[..., Any], args: tuple[Any, ...]) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """A bound handler's arguments converted now, as its :func:`typed_method` wrapper would
    convert them when called, with what to call on them (the method itself, unwrapped: nothing
    is validated twice). Lets a caller turn an input away before any of the handler runs.

    Raises:
        SerializationError: an argument does not validate (the wrapper's error, word for word).
    """
    bound: Any = method
    fn: Any = getattr(bound, "__func__", None)
    if not getattr(fn, "__durable_typed__", False):
        return method, args
    inner = fn.__wrapped__
    return functools.partial(inner, bound.__self__), convert(inner, args, fn.__durable_what__, skip=1)


def check_call(fn: Callable[..., Any], args: tuple[Any, ...], what: str, *, skip: int = 0) -> None:
    """Refuse ``args`` that ``fn`` would refuse when called with them: a wrong count or an
    argument its pydantic annotation does not validate. A caller that has ``fn`` (a client
    starting a workflow whose class it imported) says so before anything is written, instead
    of a run that fails on its first decision.

    Raises:
        ConfigurationError: ``fn`` does not take that many arguments (its signature named).
        SerializationError: an argument does not validate (see :func:`convert`).
    """
    mismatch = call_mismatch(fn, args, skip=skip)
    if mismatch is not None:
        raise ConfigurationError(f"{what} {mismatch}")
    convert(getattr(fn, "__wrapped__", fn), args, what, skip=skip, strict=True)


def call_mismatch(fn: Callable[..., Any], args: tuple[Any, ...], *, skip: int = 0) -> str | None:
    """Why ``fn`` would refuse ``args`` for their number or names (``"takes (a: int): missing
    a required argument: 'a'"``), or ``None``; ``skip``: leading parameters not given (``self``)."""
    signature = _signature(fn)
    if signature is None:  # no signature to check against: the call says
        return None
    try:
        signature.bind(*([None] * skip), *args)
    except TypeError as exc:
        with contextlib.suppress(Exception):  # annotations as written, unquoted, where they resolve
            signature = inspect.signature(fn, eval_str=True)
        params = list(signature.parameters.values())[skip:]
        shown = signature.replace(parameters=params, return_annotation=inspect.Signature.empty)
        return f"takes {shown}: {exc}"
    return None


@functools.cache
def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    """``fn``'s signature, worked out once (a start checks its arguments against it)."""
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None
