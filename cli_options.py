"""What every `tracegym` command shares: the --home option and a console for tables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

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


def table_console() -> Console:
    """A console that, when output is not a terminal, is wide enough not to squeeze tables."""
    console = Console()
    return console if console.is_terminal else Console(width=200)
