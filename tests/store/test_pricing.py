"""LLM calls priced from genai-prices' offline table, under the user's prices file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tracegym as tg
from opentelemetry.sdk.trace import TracerProvider
from tracegym.store.pricing import PRICES_ENV, Prices, PricesError, Rate, table_rate
from tracegym.store.store import Store
from tracegym.tracer.operations import state

# genai-prices' gpt-4o: $2.50 per million input tokens, $10 per million output tokens.
GPT4O_IN, GPT4O_OUT = 2.5, 10.0


def _trace(home: Path, calls: list[tuple[str, str, int, int]]) -> None:
    """One run per (run id, model, input tokens, output tokens)."""
    saved = state.tracer, state.settings
    tg.init(home=home, provider=TracerProvider(), flush_interval_s=0.05)
    try:
        for run_id, model, tokens_in, tokens_out in calls:

            @tg.llm(model=model, usage=lambda _r, i=tokens_in, o=tokens_out: (i, o))
            def think() -> str:
                return "ok"

            @tg.agent(name="a", run_id=run_id)
            def run() -> None:
                think()
                think()

            run()
        tg.shutdown()
    finally:
        state.tracer, state.settings = saved


def test_a_known_model_is_priced_from_the_table_and_an_unknown_one_is_null(tmp_path: Path):
    _trace(tmp_path, [("known", "gpt-4o", 1000, 100), ("unknown", "my-own-model-x", 1000, 100)])
    one_call = (1000 * GPT4O_IN + 100 * GPT4O_OUT) / 1e6
    with Store(tmp_path) as store:
        rows = store.sql("SELECT model, cost FROM llm_calls ORDER BY model").fetchall()
        assert [m for m, _ in rows] == ["gpt-4o", "gpt-4o", "my-own-model-x", "my-own-model-x"]
        assert rows[0][1] == pytest.approx(one_call) and rows[1][1] == pytest.approx(one_call)
        assert rows[2][1] is None and rows[3][1] is None
        runs = dict(store.sql("SELECT run_id, cost FROM traces").fetchall())
    assert runs["known"] == pytest.approx(2 * one_call)
    assert runs["unknown"] is None


def test_the_prices_file_in_the_home_overrides_the_table(tmp_path: Path):
    _trace(tmp_path, [("r", "gpt-4o", 2_000_000, 1_000_000), ("q", "qwen-local-7b", 1000, 0)])
    (tmp_path / "prices.toml").write_text(
        '[models."GPT-4o"]\ninput = 1.0\noutput = 2.0\n\n[models."qwen-*"]\ninput = 3\noutput = 0\n'
    )
    with Store(tmp_path) as store:
        runs = dict(store.sql("SELECT run_id, cost FROM traces").fetchall())
    assert runs["r"] == pytest.approx(2 * (2.0 * 1.0 + 1.0 * 2.0))
    assert runs["q"] == pytest.approx(2 * 1000 * 3 / 1e6)


def test_the_prices_variable_names_a_json_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    prices = tmp_path / "elsewhere.json"
    prices.write_text(json.dumps({"models": {"my-own-model-x": {"input": 4, "output": 8}}}))
    monkeypatch.setenv(PRICES_ENV, str(prices))
    loaded = Prices.load(tmp_path)
    assert loaded.cost("my-own-model-x", None, 1_000_000, 500_000) == pytest.approx(8.0)
    assert loaded.rate("My-Own-Model-X") == Rate(4.0, 8.0, source=str(prices))


@pytest.mark.parametrize(
    "text",
    ['{"models": {"m": {"input": -1, "output": 0}}}', '{"models": {"m": {"input": 1}}}', "[]"],
)
def test_a_bad_prices_file_is_a_clear_error(tmp_path: Path, text: str):
    (tmp_path / "prices.json").write_text(text)
    with pytest.raises(PricesError, match=r"prices\.json"):
        Prices.load(tmp_path)


def test_a_bad_prices_file_leaves_the_views_working_with_the_table(tmp_path: Path):
    _trace(tmp_path, [("known", "gpt-4o", 1000, 0)])
    (tmp_path / "prices.toml").write_text("this is not toml [")
    with pytest.warns(UserWarning, match="prices file left out"), Store(tmp_path) as store:
        cost = store.sql("SELECT cost FROM traces").fetchall()[0][0]
    assert cost == pytest.approx(2 * 1000 * GPT4O_IN / 1e6)


def test_long_context_tiers_charge_the_whole_call_at_the_tier_rate():
    rate = Rate(1.0, 2.0, tiers=((200_000, 2.0, 4.0),))
    assert rate.cost(200_000, 1_000_000) == pytest.approx(0.2 + 2.0)
    assert rate.cost(200_001, 1_000_000) == pytest.approx(200_001 * 2.0 / 1e6 + 4.0)


def test_the_table_rate_is_read_offline_and_knows_the_provider():
    assert table_rate("gpt-4o", "openai") == Rate(GPT4O_IN, GPT4O_OUT)
    assert table_rate("gpt-4o") == Rate(GPT4O_IN, GPT4O_OUT)
    assert table_rate("definitely-not-a-model-name") is None


def test_the_batch_function_agrees_with_the_row_function():
    pa = pytest.importorskip("pyarrow")
    prices = Prices({"tiered": Rate(1.0, 2.0, tiers=((200_000, 2.0, 4.0),), source="test")})
    rows = [
        ("gpt-4o", "openai", 1000, 100),
        ("tiered", None, 300_000, 10),
        ("tiered", None, 1000, 10),
        ("unknown-model-x", None, 1000, 10),
        (None, None, 5, 5),
        ("gpt-4o", None, None, None),
        ("gpt-4o", None, 7, None),
    ]
    columns = [pa.array(list(c)) for c in zip(*rows, strict=True)]
    got = prices.cost_batch(*columns).to_pylist()
    want = [prices.cost(*row) for row in rows]
    assert [g is None for g in got] == [w is None for w in want] == [
        False, False, False, True, True, True, False
    ]  # fmt: skip
    assert got == pytest.approx(want)
