"""What every `tracegym` command shares: the --home option, the checks on it, and a console for
tables.

Homes: a command that reads a home (traces, sql, show, compact, summary, outcome, analyze,
attribute, synthesize, envs ..., train, evaluate, adapters ..., nightly, dashboard) refuses one
that does not exist or is not a directory (`existing_home`: a one-line error, exit code 2),
rather than answering from an empty store: a mistyped --home must not look like "no runs".
The commands that put data into a home (demo, import, collect) create it (`writable_home`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

HomeOption = Annotated[
    Path | None,
    typer.Option(
        "--home",
        help="Data directory (default: $TRACEGYM_HOME, else ./.tracegym).",
        show_default=False,
    ),
]

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
ModelOption = Annotated[
    str,
    typer.Option(
        "--model", help="Policy: smollm2 (default, offline), tiny[-SEED], or a local HF folder."
    ),
]
EmbedderOption = Annotated[
    str,
    typer.Option(
        "--embedder",
        help="Router embeddings: minilm (the analysis extra's model) or hash (no model).",
    ),
]

Fail = Callable[[str], NoReturn]


def existing_home(home: Path, fail: Fail) -> Path:
    """`home` when it is a directory; else `fail` with a one-line error saying what to do."""
    try:
        exists, is_dir = home.exists(), home.is_dir()
    except OSError as exc:  # e.g. a parent folder we may not search
        fail(f"cannot read tracegym home {home}: {exc.strerror or exc}")
    if not exists:
        fail(
            f"no tracegym home at {home} (run `tracegym demo`, or point --home / "
            "TRACEGYM_HOME at an existing one)"
        )
    if not is_dir:
        fail(f"tracegym home {home} is not a directory")
    return home


def writable_home(home: Path, fail: Fail) -> Path:
    """`home`, created when missing (the commands that bring data in); `fail` when it is a
    file or cannot be created."""
    if home.exists() and not home.is_dir():
        fail(f"tracegym home {home} is not a directory")
    try:
        home.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        fail(f"cannot create tracegym home {home}: {exc.strerror or exc}")
    return home


def table_console() -> Console:
    """A console for tables of trace content: no emoji codes (`:x:` stays text) and, when
    output is not a terminal, wide enough not to squeeze tables. Data is still escaped (or
    passed as `rich.text.Text`): markup is on for the commands' own styling."""
    console = Console(emoji=False)
    return console if console.is_terminal else Console(width=200, emoji=False)


def hide_flag_types(command: Any, ctx: Any) -> None:
    """No `<bool>` next to flags in `--help` (Typer's rich help shows a type for every option,
    flags and `--help` included): an empty metavar on every flag of `command`, its help
    option and, for a group, its subcommands'."""
    from typer.core import TyperGroup

    todo = [command]
    while todo:
        current = todo.pop()
        for option in (*current.params, current.get_help_option(ctx)):
            hide_flag_type(option)
        if isinstance(current, TyperGroup):
            todo.extend(current.commands.values())


def hide_flag_type(option: Any) -> None:
    """An empty metavar on `option` when it is a flag (see `hide_flag_types`)."""
    if getattr(option, "is_flag", False) and getattr(option, "metavar", "") is None:
        option.metavar = ""


def print_json(data: Any) -> None:
    """A command's `--json` answer on stdout: indented, non-ASCII kept, anything else as str."""
    sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
