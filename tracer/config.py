"""Tracer settings: arguments to `tracegym.init`, else environment variables, else defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_HOME = ".tracegym"


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def _messages_from_env() -> tuple[bool, bool]:
    """(capture, export) of LLM messages from TRACEGYM_CAPTURE_MESSAGES, else the GenAI
    convention's OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT: either set true captures
    and exports them, false neither; unset: captured for the local store only."""
    for name in ("TRACEGYM_CAPTURE_MESSAGES", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"):
        raw = (os.environ.get(name) or "").strip()
        if raw:
            on = raw.lower() in {"1", "true", "yes", "on"}
            return on, on
    return True, False


def _env_level(name: str, default: str) -> str:
    """An OpenInference level: off (0, false, no), kinds, full (1, true, yes, on)."""
    raw = (os.environ.get(name) or "").strip().lower()
    if raw in {"0", "false", "no", "off"}:
        return "off"
    if raw in {"1", "true", "yes", "on", "full"}:
        return "full"
    return "kinds" if raw == "kinds" else default


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return default


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ[name])
    except (KeyError, ValueError):
        return default


def resolve_home(home: str | os.PathLike[str] | None = None) -> Path:
    """The data directory: `home`, else $TRACEGYM_HOME, else ./.tracegym."""
    return Path(home or os.environ.get("TRACEGYM_HOME") or DEFAULT_HOME).expanduser()


@dataclass
class Settings:
    """What the hot path reads on every span; replaced as a whole by `tracegym.init`."""

    capture_content: bool = True
    # LLM messages: captured (for the local store) by default; sent to OTLP and the
    # application's exporters only when asked for (`capture_messages=True`, or the variables).
    capture_messages: bool = True
    export_messages: bool = False
    # OpenInference attributes alongside the GenAI ones, for Phoenix (tracer/openinference.py):
    # "kinds" (the span kind only), "full" (also input/output values, model, tokens) or "off".
    # What an OTLP export carries, not what the spool keeps.
    openinference: str = "kinds"
    max_value_length: int = 8192
    home: Path = field(default_factory=resolve_home)
    flush_interval_s: float = 1.0
    max_queue_size: int = 65536
    # How long exit (and `tracegym.shutdown`) waits for the last exports; the rest is counted.
    shutdown_timeout_s: float = 3.0

    @classmethod
    def from_env(cls) -> Settings:
        capture_messages, export_messages = _messages_from_env()
        return cls(
            capture_content=_env_bool("TRACEGYM_CAPTURE_CONTENT", True),
            capture_messages=capture_messages,
            export_messages=export_messages,
            openinference=_env_level("TRACEGYM_OPENINFERENCE", "kinds"),
            max_value_length=max(64, _env_int("TRACEGYM_MAX_VALUE_LENGTH", 8192)),
            home=resolve_home(),
            flush_interval_s=max(0.01, _env_float("TRACEGYM_FLUSH_INTERVAL_S", 1.0)),
            max_queue_size=max(16, _env_int("TRACEGYM_MAX_QUEUE_SIZE", 65536)),
            shutdown_timeout_s=max(0.0, _env_float("TRACEGYM_SHUTDOWN_TIMEOUT_S", 3.0)),
        )


settings = Settings.from_env()
