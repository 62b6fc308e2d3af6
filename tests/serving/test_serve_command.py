"""`tracegym serve`'s user errors: one line, exit code 2, no traceback."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tests.serving.fakes import adapter_home


@pytest.mark.parametrize(
    "args, says",
    [
        ([], "--model NAME"),
        (["--upstream", "127.0.0.1:8000"], "http(s) URL"),
        (["--upstream", "http://127.0.0.1:1/v1", "--host", "0.0.0.0"], "loopback only"),
    ],
)
def test_user_errors_exit_2_with_one_line(tmp_path, args, says):
    from tracegym.cli import app

    adapter_home(tmp_path)
    result = CliRunner().invoke(app, ["--home", str(tmp_path), "serve", *args])
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output


def test_adapters_on_different_base_models_need_base_model(tmp_path):
    from tracegym.cli import app
    from tracegym.store.home import Home, read_json, write_json

    adapter_home(tmp_path)
    meta = Home.at(tmp_path).adapters / "refund" / "meta.json"
    write_json(meta, {**read_json(meta), "base_model": {"name": "other/model"}})
    result = CliRunner().invoke(
        app, ["--home", str(tmp_path), "serve", "--upstream", "http://127.0.0.1:1/v1"]
    )
    assert result.exit_code == 2 and "--base-model" in result.output
