"""`tracegym.instrument("openai", "anthropic", ...)`: auto-instrumentation by reuse.

Each integration is the well-kept OpenInference instrumentor for that library, installed on
tracegym's tracer provider, so its spans nest under the caller's `@tg.agent` / `tg.step` spans
(same OpenTelemetry context), pass through tracegym's processor (run/step bookkeeping and the
content policy, `tracer/third_party.py`), its redaction, and land in the store's `llm_calls` and
`tool_calls` through the mapping the OTLP receiver uses (`attribute_mapping.normalize_attributes`).

The instrumentors get a provider of tracegym's own whose tracers look up, span by span, the
provider `tracegym.init` installed on: `instrument` may run before `init` (calls made before
`init` run untraced), and a later `init` on another provider is followed without
re-instrumenting. Nothing here raises at span time: a missing package or an unknown name is
refused when `instrument` is called, with the extra to install. The OpenAI Agents SDK with its
own tracing switched off sends us nothing: that is warned about once (`tracer/agents_sdk.py`).
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.util.types import Attributes
from tracegym.tracer import agents_sdk, internal
from tracegym.tracer.setup import installed_provider


@dataclass(frozen=True)
class Integration:
    """One library tracegym can instrument, and what it takes."""

    name: str  # what `instrument` is given
    library: str  # the instrumented library's import name
    instrumentor_module: str
    instrumentor_class: str
    distribution: str  # the instrumentor's package on the index
    extra: str  # tracegym's extra that installs both

    def install_hint(self) -> str:
        return f"pip install 'tracegym[{self.extra}]'"


INTEGRATIONS: dict[str, Integration] = {
    i.name: i
    for i in (
        Integration("openai", "openai", "openinference.instrumentation.openai",
                    "OpenAIInstrumentor", "openinference-instrumentation-openai", "openai"),
        Integration("anthropic", "anthropic", "openinference.instrumentation.anthropic",
                    "AnthropicInstrumentor", "openinference-instrumentation-anthropic",
                    "anthropic"),
        Integration("langchain", "langchain_core", "openinference.instrumentation.langchain",
                    "LangChainInstrumentor", "openinference-instrumentation-langchain",
                    "langchain"),
        Integration("openai-agents", "agents", "openinference.instrumentation.openai_agents",
                    "OpenAIAgentsInstrumentor", "openinference-instrumentation-openai-agents",
                    "openai-agents"),
        Integration("litellm", "litellm", "openinference.instrumentation.litellm",
                    "LiteLLMInstrumentor", "openinference-instrumentation-litellm", "litellm"),
    )
}  # fmt: skip
ALIASES = {"langgraph": "langchain", "openai_agents": "openai-agents", "agents": "openai-agents"}


class IntegrationError(ImportError):
    """An integration that cannot be installed: a missing package, or an unknown name."""


# ---------------------------------------------------------------------------------------------
# A provider whose tracers follow tracegym's installation


class _FollowingTracer(trace.Tracer):
    """Starts each span on the tracer of the provider `tracegym.init` installed on right now
    (a no-op tracer before `init`, or when tracing is disabled)."""

    def __init__(
        self, name: str, version: str | None, schema_url: str | None, attributes: Attributes
    ) -> None:
        self._args = (name, version, schema_url, attributes)
        self._provider: Any = None
        self._tracer: trace.Tracer = trace.NoOpTracer()

    def _target(self) -> trace.Tracer:
        provider = installed_provider()
        if provider is not self._provider:
            name, version, schema_url, attributes = self._args
            self._tracer = (
                provider.get_tracer(name, version, schema_url, attributes)
                if provider is not None
                else trace.NoOpTracer()
            )
            self._provider = provider
        return self._tracer

    def start_span(self, *args: Any, **kwargs: Any) -> trace.Span:
        return self._target().start_span(*args, **kwargs)

    def start_as_current_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._target().start_as_current_span(*args, **kwargs)


class FollowingTracerProvider(trace.TracerProvider):
    """What the instrumentors are given as `tracer_provider` (see the module docstring)."""

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes = None,
    ) -> trace.Tracer:
        return _FollowingTracer(
            instrumenting_module_name, instrumenting_library_version, schema_url, attributes
        )


_provider = FollowingTracerProvider()


# ---------------------------------------------------------------------------------------------
# instrument / uninstrument


class _Active:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.instrumentors: dict[str, Any] = {}  # name -> the instrumentor tracegym installed


_active = _Active()


def _resolve(name: str) -> Integration:
    key = ALIASES.get(name.lower().strip(), name.lower().strip())
    integration = INTEGRATIONS.get(key)
    if integration is None:
        known = ", ".join(sorted(INTEGRATIONS))
        raise IntegrationError(f"tracegym.instrument: unknown integration {name!r} ({known})")
    return integration


def _missing(integration: Integration) -> list[str]:
    """The packages `integration` needs that are not installed."""
    missing = []
    if importlib.util.find_spec(integration.library) is None:
        missing.append(integration.library)
    try:
        found = importlib.util.find_spec(integration.instrumentor_module) is not None
    except ModuleNotFoundError:  # its parent package (openinference.instrumentation) is absent
        found = False
    if not found:
        missing.append(integration.distribution)
    return missing


def available() -> list[str]:
    """The integrations whose packages are installed."""
    return [name for name, i in INTEGRATIONS.items() if not _missing(i)]


def _install(integration: Integration, options: dict[str, Any]) -> bool:
    """Instrument one library; False when someone else already had it instrumented."""
    module = importlib.import_module(integration.instrumentor_module)
    instrumentor = getattr(module, integration.instrumentor_class)()
    if instrumentor.is_instrumented_by_opentelemetry:  # the application did it itself
        internal.logger.info(
            "tracegym: %s is already instrumented; its spans reach tracegym only if they go to "
            "tracegym's provider",
            integration.name,
        )
        return False
    instrumentor.instrument(tracer_provider=_provider, **options)
    if not instrumentor.is_instrumented_by_opentelemetry:  # the SDK refused a version conflict
        raise IntegrationError(
            f"tracegym.instrument({integration.name!r}): {integration.distribution} refused the "
            f"installed {integration.library} (a version conflict, logged by "
            f"opentelemetry.instrumentation); try {integration.install_hint()} --upgrade"
        )
    _active.instrumentors[integration.name] = instrumentor
    if integration.name == "openai-agents":  # its runs reach us only with its tracing on
        agents_sdk.watch()
    return True


def instrument(*names: str, strict: bool = True, **options: Any) -> list[str]:
    """Trace the listed libraries' calls through tracegym; returns the integrations active now.

    Names: "openai", "anthropic", "langchain" (LangChain and LangGraph), "openai-agents",
    "litellm"; none: every integration whose packages are installed. `options` go to each
    instrumentor's `instrument()` (for example OpenInference's `config=TraceConfig(...)`).

    A name whose packages are missing raises `IntegrationError` naming the extra to install
    (`strict=False`: logs it and goes on). Instrumenting twice is a no-op. May be called before
    `tracegym.init`: spans are recorded from `init` on.
    """
    wanted = [_resolve(n) for n in names] if names else list(INTEGRATIONS.values())
    problems = []
    with _active.lock:
        for integration in wanted:
            if integration.name in _active.instrumentors:
                continue
            missing = _missing(integration)
            if missing:
                if names:
                    problems.append(
                        f"tracegym.instrument({integration.name!r}) needs "
                        f"{' and '.join(missing)}: {integration.install_hint()}"
                    )
                continue
            try:
                _install(integration, dict(options))
            except IntegrationError as exc:
                problems.append(str(exc))
        active = list(_active.instrumentors)
    if problems:
        message = "; ".join(problems)
        if strict:
            raise IntegrationError(message)
        internal.logger.warning("%s", message)
    return active


def uninstrument(*names: str) -> list[str]:
    """Undo `instrument` for the listed integrations (none: all); returns those still active.
    Only what tracegym instrumented is undone."""
    with _active.lock:
        targets = [_resolve(n).name for n in names] if names else list(_active.instrumentors)
        for name in targets:
            instrumentor = _active.instrumentors.pop(name, None)
            if instrumentor is None:
                continue
            if name == "openai-agents":
                agents_sdk.unwatch()
            try:
                instrumentor.uninstrument()
            except Exception as exc:
                internal.report_error(f"uninstrument.{name}", exc)
        return list(_active.instrumentors)


def instrumented() -> list[str]:
    """The integrations tracegym has instrumented."""
    with _active.lock:
        return list(_active.instrumentors)


@contextmanager
def instrumenting(*names: str, **options: Any) -> Iterator[list[str]]:
    """`instrument(*names)` for the block, then `uninstrument` of what it added (for tests)."""
    before = set(instrumented())
    active = instrument(*names, **options)
    try:
        yield active
    finally:
        added: Sequence[str] = [n for n in instrumented() if n not in before]
        if added:
            uninstrument(*added)
