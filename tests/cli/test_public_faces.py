"""Each room's public face: its `__all__` names resolve, unknown names raise AttributeError, and
importing the room loads none of the heavy modules behind it until a name is used."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

ROOMS = ["tracegym.store", "tracegym.analysis", "tracegym.generation", "tracegym.training"]


@pytest.mark.parametrize("room", ROOMS)
def test_every_public_name_resolves(room: str) -> None:
    package = importlib.import_module(room)
    assert package.__all__, room
    assert sorted(dir(package)) == sorted(package.__all__)
    for name in package.__all__:
        assert getattr(package, name) is not None, f"{room}.{name}"


@pytest.mark.parametrize("room", ROOMS)
def test_an_unknown_name_is_an_attribute_error(room: str) -> None:
    package = importlib.import_module(room)
    with pytest.raises(AttributeError, match="no_such_name"):
        package.no_such_name  # noqa: B018


def test_importing_a_room_loads_nothing_behind_it() -> None:
    code = (
        "import sys, tracegym.store, tracegym.analysis, tracegym.training, tracegym.generation\n"
        "heavy = [m for m in ('duckdb', 'polars', 'torch', 'transformers', 'tracegym.store.store',"
        " 'tracegym.analysis.pipeline', 'tracegym.training.sft') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
        "from tracegym.store import Home\n"
        "print('duckdb' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    heavy, duckdb_after_home = done.stdout.splitlines()
    assert heavy == ""
    assert duckdb_after_home == "False"
