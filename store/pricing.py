"""What an LLM call cost in USD: genai-prices' offline table, under the user's own prices.

genai-prices (pydantic's maintained table of model prices, shipped inside the wheel) is read
offline: nothing is fetched at run time. Its price for a model is looked up once per (model,
provider) and kept, so pricing a row is a dict look-up and two multiplications (the package's
own `calc_price` takes ~0.1-0.5 ms a call, too slow for a view over every LLM span).

The user's prices win over the table: a TOML or JSON file named by $TRACEGYM_PRICES (the CLI's
`--prices FILE` sets it), else `<home>/prices.toml`, else `<home>/prices.json`:

    [models."my-local-model"]      # a model name or a glob ("qwen*"), case-insensitive
    input = 0.0                    # USD per million input tokens
    output = 0.0                   # USD per million output tokens

A model neither names is unknown: its cost is NULL, never a guess of zero.
"""

from __future__ import annotations

import fnmatch
import json
import os
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

PRICES_ENV = "TRACEGYM_PRICES"
PRICES_FILES = ("prices.toml", "prices.json")
SOURCE_TABLE = "genai-prices"


class PricesError(ValueError):
    """A prices file that cannot be read or does not have the documented shape."""


@dataclass(frozen=True)
class Rate:
    """A model's prices in USD per million tokens. `tiers`: (input tokens above which the
    whole call is charged at this rate, input, output), the "cliff" tiers of long contexts."""

    input: float
    output: float
    tiers: tuple[tuple[int, float, float], ...] = ()
    source: str = SOURCE_TABLE

    def cost(self, input_tokens: int | None, output_tokens: int | None) -> float:
        tokens_in, tokens_out = input_tokens or 0, output_tokens or 0
        rate_in, rate_out = self.input, self.output
        for start, tier_in, tier_out in sorted(self.tiers, reverse=True):
            if tokens_in > start:
                rate_in, rate_out = tier_in, tier_out
                break
        return (tokens_in * rate_in + tokens_out * rate_out) / 1e6


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise PricesError(f"{where} must be a non-negative number (USD per million tokens)")
    return float(value)


def _parse(text: str, path: Path) -> dict[str, Rate]:
    try:
        if path.suffix.lower() == ".json":
            doc = json.loads(text)
        else:
            import tomllib

            doc = tomllib.loads(text)
    except ImportError as exc:  # Python 3.10: no tomllib
        raise PricesError(f"{path}: TOML needs Python 3.11+; write it as JSON") from exc
    except ValueError as exc:  # JSONDecodeError and TOMLDecodeError are both ValueErrors
        raise PricesError(f"{path}: {exc}") from exc
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, dict):
        raise PricesError(f'{path}: wants a "models" table of model name -> input, output')
    rates: dict[str, Rate] = {}
    for name, entry in models.items():
        where = f"{path}: models.{name}"
        if not isinstance(entry, dict) or not {"input", "output"} <= entry.keys():
            raise PricesError(f"{where} wants input and output (USD per million tokens)")
        rates[name.lower()] = Rate(
            _number(entry["input"], f"{where}.input"),
            _number(entry["output"], f"{where}.output"),
            source=str(path),
        )
    return rates


def prices_file(home: str | os.PathLike[str]) -> Path | None:
    """The user's prices file: $TRACEGYM_PRICES, else the first of PRICES_FILES in `home`."""
    named = os.environ.get(PRICES_ENV, "").strip()
    if named:
        return Path(named).expanduser()
    for name in PRICES_FILES:
        path = Path(home) / name
        if path.is_file():
            return path
    return None


def load_overrides(path: Path | None) -> dict[str, Rate]:
    if path is None:
        return {}
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PricesError(f"cannot read the prices file {path}: {exc}") from exc
    return _parse(text, path)


_table_lock = threading.Lock()
_table_rates: dict[tuple[str, str | None], Rate | None] = {}


def _decimal(value: Any) -> float | None:
    if value is None:
        return None
    return float(getattr(value, "base", value))


def _tiers(input_price: Any, output_price: Any) -> tuple[tuple[int, float, float], ...]:
    starts = {t.start for p in (input_price, output_price) for t in getattr(p, "tiers", ())}

    def at(price: Any, start: int) -> float:
        applicable = getattr(price, "base", price)
        for tier in getattr(price, "tiers", ()):
            if tier.start <= start:
                applicable = tier.price
        return float(applicable or 0)

    return tuple((s, at(input_price, s), at(output_price, s)) for s in sorted(starts))


def table_rate(model: str, provider: str | None = None) -> Rate | None:
    """genai-prices' current rate for `model` (through `provider` where it knows that provider),
    or None where it does not know the model. Cached per process."""
    key = (model.lower(), (provider or "").lower() or None)
    with _table_lock:
        if key in _table_rates:
            return _table_rates[key]
    rate = _lookup(*key)
    with _table_lock:
        _table_rates[key] = rate
    return rate


def _lookup(model: str, provider: str | None) -> Rate | None:
    try:
        from genai_prices import data_snapshot
    except ImportError:  # an install without the `analysis` extra: no table, no cost
        return None
    snapshot = data_snapshot.get_snapshot()
    found = None
    for provider_id in dict.fromkeys((provider, None)):
        try:
            found = snapshot.find_provider_model(model, None, provider_id, None)
            break
        except LookupError:
            continue
    if found is None:
        return None
    prices = found[1].get_prices(datetime.now(tz=timezone.utc))
    input_price = getattr(prices, "input_mtok", None)
    output_price = getattr(prices, "output_mtok", None)
    if input_price is None and output_price is None:
        return None
    return Rate(
        _decimal(input_price) or 0.0,
        _decimal(output_price) or 0.0,
        _tiers(input_price, output_price),
    )


@dataclass
class Prices:
    """The user's rates over the table's; `cost` is what a view's `tracegym_cost` calls."""

    overrides: dict[str, Rate] = field(default_factory=dict)

    @classmethod
    def load(cls, home: str | os.PathLike[str]) -> Prices:
        return cls(load_overrides(prices_file(home)))

    def rate(self, model: str | None, provider: str | None = None) -> Rate | None:
        if not model:
            return None
        name = model.lower()
        if name in self.overrides:
            return self.overrides[name]
        for pattern, rate in self.overrides.items():
            if fnmatch.fnmatchcase(name, pattern):
                return rate
        return table_rate(model, provider)

    def cost(
        self,
        model: str | None,
        provider: str | None,
        input_tokens: int | None,
        output_tokens: int | None,
    ) -> float | None:
        """USD for one call, or None for an unknown model or a call without token counts."""
        if input_tokens is None and output_tokens is None:
            return None
        rate = self.rate(model, provider)
        return None if rate is None else rate.cost(input_tokens, output_tokens)

    def cost_batch(self, models: Any, providers: Any, inputs: Any, outputs: Any) -> Any:
        """`cost` over Arrow arrays, for DuckDB's vectorised UDF: one rate look-up per distinct
        (model, provider) of the batch, then array arithmetic (a row-at-a-time Python UDF
        costs ~10 us a row)."""
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        models, providers, inputs, outputs = (
            a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a
            for a in (models, providers, inputs, outputs)
        )
        pairs = pc.binary_join_element_wise(
            pc.fill_null(models, ""), pc.fill_null(providers, ""), "\x1f"
        )
        encoded = pairs.dictionary_encode()
        rates = [self.rate(*pair.split("\x1f", 1)) for pair in encoded.dictionary.to_pylist()]
        index = encoded.indices.to_numpy(zero_copy_only=False)
        per_in = np.array([r.input if r else np.nan for r in rates] or [np.nan], np.float64)
        per_out = np.array([r.output if r else np.nan for r in rates] or [np.nan], np.float64)
        tokens_in = pc.fill_null(inputs, 0).to_numpy(zero_copy_only=False).astype(np.float64)
        tokens_out = pc.fill_null(outputs, 0).to_numpy(zero_copy_only=False).astype(np.float64)
        values = (tokens_in * per_in[index] + tokens_out * per_out[index]) / 1e6
        for k, rate in enumerate(rates):  # long-context tiers: the few rates that have any
            if rate is not None and rate.tiers:
                for i in np.flatnonzero(index == k):
                    values[i] = rate.cost(int(tokens_in[i]), int(tokens_out[i]))
        no_tokens = pc.and_(inputs.is_null(), outputs.is_null()).to_numpy(zero_copy_only=False)
        return pa.array(values, type=pa.float64(), mask=np.isnan(per_in[index]) | no_tokens)


def usd(value: float | None) -> str:
    """A cost for people: "–" where no call had a known price; small ones to six places."""
    if value is None:
        return "–"
    return f"${value:.2f}" if value >= 1 else f"${value:.4f}" if value >= 0.001 else f"${value:.6f}"


def run_cost(store: Any, trace_id: str) -> float | None:
    """The run's priced LLM calls summed, as `traces.cost`; None when none has a price."""
    return store.sql(
        "SELECT sum(cost) FROM llm_calls WHERE trace_id = $t", {"t": trace_id}
    ).fetchall()[0][0]
