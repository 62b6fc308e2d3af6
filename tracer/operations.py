"""The traced operations (agent, tool, llm, memory, step, subtask): each a decorator and a
context manager over one OpenTelemetry span.

`Operation` holds the machinery shared by every kind: wrapping sync, async, generator and
async-generator functions, entering and leaving the span's context, recording errors without
changing them, and swallowing (and counting) every failure of its own. Subclasses only say
what their span is called and which attributes it carries.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import inspect
import threading
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from tracegym.tracer import context as scope_context
from tracegym.tracer import internal
from tracegym.tracer import semconv as sc
from tracegym.tracer.config import settings as _default_settings
from tracegym.tracer.context import Scope
from tracegym.tracer.openinference import FULL as _OI_FULL
from tracegym.tracer.openinference import OFF as _OI_OFF
from tracegym.tracer.openinference import SPAN_KINDS, attributes_for
from tracegym.tracer.serialize import truncate

F = TypeVar("F", bound=Callable[..., Any])
_UNSET: Any = object()
_STEP_INDEX, _AGENT_NAME, _OI_SPAN_KIND = sc.STEP_INDEX, sc.AGENT_NAME, sc.OI_SPAN_KIND
_current_scope = scope_context.current.get
_GENERATOR_KEEP = 100  # yielded items kept for the span's output
_STATUS_LENGTH = 1024  # characters of "Type: message" kept as the span's status description


class _State:
    """What `init` and `testing` swap: the tracer spans come from and the settings."""

    tracer: trace.Tracer = trace.get_tracer(sc.INSTRUMENTATION_SCOPE)
    settings = _default_settings


state = _State()


def _caught(where: str, exc: BaseException) -> None:
    """What every catch site does: an Exception is tracegym's own failure (an internal error);
    anything else came from a user value, or is a Ctrl-C that `internal.swallow` re-raises."""
    if isinstance(exc, Exception):
        internal.report_error(where, exc)
    else:
        internal.swallow(where, exc)


def _flow() -> tuple[int, int]:
    """Who is inside a `with`: the thread and, under asyncio, the task. One `with` object may
    be entered by several at once; each must leave its own span."""
    try:
        task = id(asyncio.current_task())
    except RuntimeError:  # no running event loop in this thread
        task = 0
    return threading.get_ident(), task


def _binder(fn: Callable[..., Any]) -> Callable[[tuple, dict | None], dict[str, Any]]:
    """A fast `(args, kwargs) -> {name: value}` for `fn`, leaving out self/cls; the plan (the
    parameter names) is read from the signature once, at decoration time."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return lambda args, kwargs: {"args": args, **(kwargs or {})} if args else dict(kwargs or {})
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = tuple(p.name for p in params if p.kind in kinds)
    star = next((p.name for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), "args")
    count = len(names)
    if names and names[0] in ("self", "cls"):
        first = names[0]

        def bind_method(args: tuple, kwargs: dict | None) -> dict[str, Any]:
            bound = dict(zip(names, args))  # noqa: B905 - as far as both go: see bind
            bound.pop(first, None)
            if len(args) > count:
                bound[star] = args[count:]
            if kwargs:
                bound.update(kwargs)
            return bound

        return bind_method

    def bind(args: tuple, kwargs: dict | None) -> dict[str, Any]:
        # zip stops at the shorter on purpose: parameters not given are left out, arguments
        # past the names go under *args below. (`strict=False` spelled out costs 0.2 us a call:
        # zip's keyword path.)
        bound = dict(zip(names, args))  # noqa: B905
        if len(args) > count:
            bound[star] = args[count:]
        if kwargs:
            bound.update(kwargs)
        return bound

    return bind


class Handle:
    """One live span of an operation; what a `with` block gets to add results and usage."""

    __slots__ = ("_tokens", "arguments", "ctx", "op", "result", "scope", "span")

    def __init__(
        self, op: Operation, span: trace.Span, scope: Scope | None, arguments: dict[str, Any]
    ) -> None:
        self.op = op
        self.arguments = arguments
        self.span = span
        self.scope = scope  # set by operations that open a new scope (agent, subtask)
        self.ctx = trace.set_span_in_context(span)
        self.result: Any = _UNSET
        self._tokens: list[tuple[object, object]] = []

    def activate(self) -> None:
        token = otel_context.attach(self.ctx)
        scope_token = scope_context.current.set(self.scope) if self.scope is not None else None
        self._tokens.append((token, scope_token))

    def deactivate(self) -> None:
        token, scope_token = self._tokens.pop()
        if scope_token is not None:
            scope_context.current.reset(scope_token)  # type: ignore[arg-type]
        otel_context.detach(token)  # type: ignore[arg-type]

    # Public helpers for `with` blocks -------------------------------------------------------
    def set_result(self, value: Any) -> None:
        """Record the operation's result (tool result, model output, records read, ...)."""
        self.result = value

    def set_attribute(self, key: str, value: Any) -> None:
        try:
            self.span.set_attribute(key, value)
        except BaseException as exc:
            _caught("set_attribute", exc)

    def set_usage(self, input_tokens: int | None = None, output_tokens: int | None = None) -> None:
        """Record LLM token usage on this span and charge it to the run's budgets."""
        _record_usage(self.span, input_tokens, output_tokens)


def _record_usage(span: trace.Span, input_tokens: Any, output_tokens: Any) -> None:
    try:
        total = 0
        if issubclass(type(input_tokens), int):  # type(x): never the value's own __class__
            span.set_attribute(sc.INPUT_TOKENS, input_tokens)
            total += input_tokens
        if issubclass(type(output_tokens), int):
            span.set_attribute(sc.OUTPUT_TOKENS, output_tokens)
            total += output_tokens
        if total:
            scope_context.charge_tokens(total)
    except BaseException as exc:  # the counts are the user's values: int subclasses may raise
        _caught("usage", exc)


def _openinference(handle: Handle) -> None:
    """The span's OpenInference attributes (openinference.py) as it ends, at level full: what
    `attributes_for` derives from its other attributes. (Its kind, a constant of the
    operation, is among the attributes it starts with, `Operation.begin`: one dict entry
    instead of a locked `set_attribute` call at the end.) Below full: nothing, and `finish`
    does not call it."""
    if state.settings.openinference not in _OI_FULL:
        return
    span = handle.span
    attrs = getattr(span, "attributes", None)
    if attrs:
        derived = attributes_for(attrs)
        if derived:
            span.set_attributes(derived)


def _error_type(exc: BaseException) -> str:
    kind = type(exc)
    return (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )


def _message(exc: BaseException) -> str:
    """str(exc), or a placeholder when the user's exception cannot say what it is."""
    try:
        return str(exc)
    except BaseException as inner:
        internal.swallow("inspect", inner)
        return f"<unprintable {type(exc).__qualname__}>"


def _record_exception(span: trace.Span, exc: BaseException, error_type: str) -> None:
    """The SDK's exception event; built by hand when the exception's __str__ raises."""
    try:
        span.record_exception(exc, escaped=True)
        return
    except BaseException as inner:
        internal.swallow("inspect", inner)
    try:
        stacktrace = "".join(traceback.format_exception(exc))
    except BaseException as inner:
        internal.swallow("inspect", inner)
        stacktrace = ""
    span.add_event(
        "exception",
        {
            "exception.type": error_type,
            "exception.message": _message(exc),
            "exception.stacktrace": stacktrace,
            "exception.escaped": "True",
        },
    )


class Operation:
    """Base of every traced operation: use one as `@decorator`, `with` or `async with`."""

    operation: str = ""  # gen_ai.operation.name
    takes_step = True  # claims a step index of the run
    # What every span of this operation starts from, made on its first call (so that
    # `static_attributes` sees the settings `init` made) and kept: (span name, static
    # attributes, OpenInference span kind).
    _plan: tuple[str, dict[str, Any], str | None] | None = None

    # Set per class (`__init_subclass__`): which hooks a call must go through, so that the
    # kinds that keep the defaults skip the calls (a tool call is a few microseconds).
    _ends = False  # overrides on_end
    _starts = False  # overrides start_span
    _scopes = False  # overrides open_scope (agent, subtask)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._ends = cls.on_end is not Operation.on_end
        cls._starts = cls.start_span is not Operation.start_span
        cls._scopes = cls.open_scope is not Operation.open_scope

    def __init__(self, name: str | None = None, *, capture: bool | None = None, **call: Any):
        self.name = name
        self.capture = capture  # None: follow the global content-capture setting
        self.call = call  # values given to a `with` form instead of function arguments
        self._binder: Callable[[tuple, dict | None], dict[str, Any]] | None = None
        self._active: dict[tuple[int, int], list[Handle]] = {}  # `with` spans per thread/task

    # What subclasses describe ---------------------------------------------------------------
    def span_name(self) -> str:
        return f"{self.operation} {self.name}"

    def static_attributes(self) -> dict[str, Any]:
        return {sc.OPERATION: self.operation}

    def call_attributes(self, attrs: dict[str, Any], arguments: dict[str, Any], capture: bool):
        """Add the attributes that depend on this call's arguments."""

    def on_result(self, handle: Handle, result: Any, capture: bool) -> None:
        """Record what the call returned."""

    def open_scope(self, span: trace.Span, parent: Scope | None, arguments: dict) -> Scope | None:
        """Operations that contain others (agent, subtask) return the scope their children see."""
        return None

    def on_end(self, handle: Handle) -> None:
        """Last words before the span ends (budgets used)."""

    # Span lifecycle -------------------------------------------------------------------------
    def _capture(self) -> bool:
        return state.settings.capture_content if self.capture is None else self.capture

    def start_span(self, attrs: dict[str, Any], parent: Scope | None) -> trace.Span:
        return state.tracer.start_span(
            self._span_name, attributes=attrs, record_exception=False, set_status_on_exception=False
        )

    def _make_plan(self) -> tuple[str, dict[str, Any], str | None]:
        plan = self._plan = (self._span_name, self._static, SPAN_KINDS.get(self.operation))
        return plan

    def begin(self, args: tuple = (), kwargs: dict | None = None) -> Handle | None:
        """Start and activate the span; None (counted) if tracegym itself failed."""
        try:
            binder = self._binder
            arguments = binder(args, kwargs) if binder is not None else self.call
            settings = state.settings
            capture = settings.capture_content if self.capture is None else self.capture
            parent = _current_scope()
            plan = self._plan or self._make_plan()
            attrs = plan[1].copy()
            if parent is not None and self.takes_step:
                attrs[_STEP_INDEX] = scope_context.next_step(parent)
                attrs[_AGENT_NAME] = parent.agent
            self.call_attributes(attrs, arguments, capture)
            kind = plan[2]
            if kind is not None and settings.openinference not in _OI_OFF:  # (kinds or full)
                attrs[_OI_SPAN_KIND] = kind
            if self._starts:
                span = self.start_span(attrs, parent)
            else:  # `start_span`, inline
                span = state.tracer.start_span(
                    plan[0], attributes=attrs, record_exception=False, set_status_on_exception=False
                )
        except BaseException as exc:
            _caught(f"begin.{self.operation}", exc)
            return None
        try:
            scope = self.open_scope(span, parent, arguments) if self._scopes else None
            handle = Handle(self, span, scope, arguments)
            # `handle.activate()`, inline
            token = otel_context.attach(handle.ctx)
            scope_token = scope_context.current.set(scope) if scope is not None else None
            handle._tokens.append((token, scope_token))
            return handle
        except BaseException as exc:  # the span exists: end it rather than leak it
            try:
                span.end()
            except BaseException as inner:
                _caught("end", inner)
            _caught(f"begin.{self.operation}", exc)
            return None

    def finish(self, handle: Handle | None, result: Any = _UNSET) -> None:
        """Record the result, then deactivate and end the span. Never raises."""
        if handle is None:
            return
        try:
            try:
                if result is _UNSET:
                    result = handle.result
                settings = state.settings
                if result is not _UNSET:
                    capture = self.capture
                    if capture is None:
                        capture = settings.capture_content
                    self.on_result(handle, result, capture)
                if self._ends:
                    self.on_end(handle)
                if settings.openinference in _OI_FULL:
                    _openinference(handle)
            except BaseException as exc:
                _caught(f"finish.{self.operation}", exc)
        finally:  # even for a Ctrl-C re-raised above: the agent's context must be restored
            try:  # `self._close(handle)`, inline
                try:
                    if handle._tokens:
                        handle.deactivate()
                except BaseException as exc:
                    _caught("detach", exc)
            finally:
                try:
                    handle.span.end()
                except BaseException as exc:
                    _caught("end", exc)

    def fail(self, handle: Handle | None, exc: BaseException) -> None:
        """Record the user's exception on the span (type, status, event). Never raises."""
        if handle is None:
            return
        try:
            try:
                span = handle.span
                error_type = _error_type(exc)
                span.set_attribute(sc.ERROR_TYPE, error_type)
                # truncate() marks the cut, so the redactor knows a secret may run past it
                status = truncate(f"{error_type}: {_message(exc)}", _STATUS_LENGTH)
                span.set_status(Status(StatusCode.ERROR, status))
                _record_exception(span, exc, error_type)
                if self._ends:
                    self.on_end(handle)
                if state.settings.openinference in _OI_FULL:
                    _openinference(handle)
            except BaseException as inner:
                _caught(f"fail.{self.operation}", inner)
        finally:
            self._close(handle)

    def _close(self, handle: Handle) -> None:
        try:
            try:
                if handle._tokens:
                    handle.deactivate()
            except BaseException as exc:
                _caught("detach", exc)
        finally:
            try:
                handle.span.end()
            except BaseException as exc:
                _caught("end", exc)

    @property
    def _span_name(self) -> str:
        plan = self.__dict__.get("_plan")
        if plan is not None:
            return plan[0]
        name = self.__dict__.get("_cached_name")
        if name is None:
            name = self.__dict__["_cached_name"] = self.span_name()
        return name

    @property
    def _static(self) -> dict[str, Any]:
        static = self.__dict__.get("_cached_static")
        if static is None:
            static = self.__dict__["_cached_static"] = self.static_attributes()
        return static

    # Context-manager forms ------------------------------------------------------------------
    def __enter__(self) -> Handle:
        handle = self.begin()
        self._active.setdefault(_flow(), []).append(handle)
        return handle if handle is not None else Handle.__new__(_NoopHandle)

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        key = _flow()
        stack = self._active.get(key)
        handle = stack.pop() if stack else None
        if stack is not None and not stack:
            self._active.pop(key, None)
        if exc is not None:
            self.fail(handle, exc)
        else:
            self.finish(handle)

    async def __aenter__(self) -> Handle:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)

    # Decorator form -------------------------------------------------------------------------
    def __call__(self, fn: F) -> F:
        if isinstance(fn, (staticmethod, classmethod)):
            return type(fn)(self(fn.__func__))  # type: ignore[return-value]
        op = copy.copy(self)
        op._active = {}
        for cached in ("_cached_name", "_cached_static", "_plan"):
            op.__dict__.pop(cached, None)
        if op.name is None:
            op.name = getattr(fn, "__name__", "call")
        op._binder = _binder(fn)
        if inspect.isasyncgenfunction(fn):
            wrapper = _wrap_async_generator(op, fn)
        elif inspect.isgeneratorfunction(fn):
            wrapper = _wrap_generator(op, fn)
        elif inspect.iscoroutinefunction(fn):
            wrapper = _wrap_coroutine(op, fn)
        else:
            wrapper = _wrap_function(op, fn)
        wrapper = functools.wraps(fn)(wrapper)
        wrapper.__tracegym_operation__ = op  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]


class _NoopHandle(Handle):
    """Given to a `with` block when tracegym failed to start its span: accepts and ignores."""

    def set_result(self, value: Any) -> None:
        pass

    def set_attribute(self, key: str, value: Any) -> None:
        pass

    def set_usage(self, input_tokens: int | None = None, output_tokens: int | None = None) -> None:
        pass


def _wrap_function(op: Operation, fn: Callable[..., Any]) -> Callable[..., Any]:
    begin, finish, fail = op.begin, op.finish, op.fail

    def traced(*args: Any, **kwargs: Any) -> Any:
        handle = begin(args, kwargs)
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            fail(handle, exc)
            raise
        finish(handle, result)
        return result

    return traced


def _wrap_coroutine(op: Operation, fn: Callable[..., Any]) -> Callable[..., Any]:
    begin, finish, fail = op.begin, op.finish, op.fail

    async def traced(*args: Any, **kwargs: Any) -> Any:
        handle = begin(args, kwargs)
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            fail(handle, exc)
            raise
        finish(handle, result)
        return result

    return traced


class _Yielded:
    """The first items a generator yielded (its span's output) and how many there were."""

    __slots__ = ("count", "items")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.count = 0

    def add(self, item: Any) -> None:
        self.count += 1
        if self.count <= _GENERATOR_KEEP:
            self.items.append(item)

    def _count(self, handle: Handle | None) -> None:
        if handle is not None:
            try:
                handle.span.set_attribute(sc.GENERATOR_ITEMS, self.count)
            except BaseException as exc:
                _caught("generator", exc)

    def finish(self, op: Operation, handle: Handle | None, result: Any = None) -> None:
        self._count(handle)
        op.finish(handle, self.items if result is None else result)

    def fail(self, op: Operation, handle: Handle | None, exc: BaseException) -> None:
        self._count(handle)
        op.fail(handle, exc)


def _run_in(handle: Handle | None, method: Callable[[Any], Any], arg: Any) -> Any:
    """Resume a wrapped generator with the span's context active only while it runs."""
    if handle is None:
        return method(arg)
    handle.activate()
    try:
        return method(arg)
    finally:
        handle.deactivate()


async def _arun_in(handle: Handle | None, method: Callable[[Any], Any], arg: Any) -> Any:
    """`_run_in` for async generators: the context stays active across the await."""
    if handle is None:
        return await method(arg)
    handle.activate()
    try:
        return await method(arg)
    finally:
        handle.deactivate()


def _wrap_generator(op: Operation, fn: Callable[..., Any]) -> Callable[..., Any]:
    def traced(*args: Any, **kwargs: Any) -> Any:
        handle = op.begin(args, kwargs)
        if handle is not None:
            handle.deactivate()  # the consumer's code between items is not inside the span
        yielded = _Yielded()
        try:
            gen = fn(*args, **kwargs)
            method, arg = gen.send, None
            while True:
                try:
                    item = _run_in(handle, method, arg)
                except StopIteration as stop:
                    result = stop.value
                    break
                yielded.add(item)
                try:
                    arg = yield item
                    method = gen.send
                except GeneratorExit:
                    _run_in(handle, lambda _: gen.close(), None)
                    raise
                except BaseException as exc:  # thrown in by the consumer: pass it on
                    method, arg = gen.throw, exc
        except GeneratorExit:
            yielded.finish(op, handle)  # closed early by the consumer: not an error
            raise
        except BaseException as exc:
            yielded.fail(op, handle, exc)
            raise
        yielded.finish(op, handle, result)
        return result

    return traced


def _wrap_async_generator(op: Operation, fn: Callable[..., Any]) -> Callable[..., Any]:
    async def traced(*args: Any, **kwargs: Any) -> Any:
        handle = op.begin(args, kwargs)
        if handle is not None:
            handle.deactivate()
        yielded = _Yielded()
        thrown: BaseException | None = None  # what the consumer threw in at the last yield
        try:
            agen = fn(*args, **kwargs)
            method, arg = agen.asend, None
            while True:
                try:
                    item = await _arun_in(handle, method, arg)
                except StopAsyncIteration:
                    break
                yielded.add(item)
                thrown = None
                try:
                    arg = yield item
                    method = agen.asend
                except GeneratorExit:
                    await _arun_in(handle, lambda _: agen.aclose(), None)
                    raise
                except BaseException as exc:
                    method, arg, thrown = agen.athrow, exc, exc
        except GeneratorExit:
            yielded.finish(op, handle)
            raise
        except BaseException as exc:
            if exc is thrown and isinstance(exc, asyncio.CancelledError):
                # Let go of, not failed: a generator left by `break` is closed by asyncio's
                # finalizer task, and `asyncio.run` cancels that task before its first step,
                # which throws the CancelledError in at the yield (the undecorated generator
                # gets it too); it comes back out unchanged.
                yielded.finish(op, handle)
            else:
                yielded.fail(op, handle, exc)
            raise
        yielded.finish(op, handle)

    return traced
