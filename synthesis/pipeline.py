"""`synthesize(home)`: gaps.json -> validated, calibrated environments under `<home>/envs/`.

For every gap: pick the family from its detector, infer the tools' schemas, roles and flows from
the traces in the store (or, when the store holds none of the gap's tools, from its argument
patterns), build the environment, run the validity checks, calibrate the knobs against `policy`
when one is given, and register it. Gaps no family fits, or whose tools cannot express the
family, are reported as not synthesizable with the reason; environments failing validity are
reported as rejected with the failed checks. Nothing crashes on one bad gap.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tracegym.analysis.gap import Gap, GapError
from tracegym.synthesis.base import Policy
from tracegym.synthesis.calibrate import calibrate
from tracegym.synthesis.conventions import Conventions, conventions_from_store
from tracegym.synthesis.families import build_spec, family_for_gap
from tracegym.synthesis.registry import from_spec, register, unregister
from tracegym.synthesis.spec import Catalog, catalog_from_patterns, catalog_from_store
from tracegym.synthesis.validity import check_environment
from tracegym.synthesis.world import NotSynthesizable

GAPS_VERSION = 1


class GapsFileError(ValueError):
    """gaps.json is missing or malformed (the message names the file and the problem)."""


def read_gaps(path: str | Path) -> tuple[list[Gap], list[dict[str, Any]]]:
    """The gaps of a gaps.json document (docs/gaps.md), and the records that are not gaps
    (`{"gap_id", "name", "detector", "reason"}`: synthesis reports them, the others go on).
    GapsFileError when the document itself is unusable."""
    path = Path(path)
    if not path.exists():
        raise GapsFileError(
            f"{path} does not exist: run `tracegym analyze` first (it writes "
            "gaps.json), or pass --gaps PATH"
        )
    if not path.is_file():
        raise GapsFileError(f"{path} is not a file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GapsFileError(f"cannot read {path}: {exc}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GapsFileError(
            f"{path} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    if not isinstance(document, dict):
        raise GapsFileError(
            f"{path}: expected a JSON object with a 'gaps' list "
            f"(docs/gaps.md), got {type(document).__name__}"
        )
    version = document.get("version")
    if version != GAPS_VERSION:
        raise GapsFileError(
            f"{path}: gaps.json version {version!r} is not supported (expected {GAPS_VERSION})"
        )
    records = document.get("gaps")
    if not isinstance(records, list):
        raise GapsFileError(f"{path}: 'gaps' must be a list, got {type(records).__name__}")
    gaps: list[Gap] = []
    unusable: list[dict[str, Any]] = []
    for i, record in enumerate(records):
        if not isinstance(record, dict):
            raise GapsFileError(f"{path}: gaps[{i}] must be an object, got {type(record).__name__}")
        if not isinstance(record.get("id"), str) or not record["id"].strip():
            raise GapsFileError(f"{path}: gaps[{i}] has no 'id' string")
        if not (record.get("key") or record.get("detector")):
            raise GapsFileError(
                f"{path}: gaps[{i}] ({record['id']}) has neither 'key' nor 'detector'"
            )
        for name in ("tools", "argument_patterns", "examples", "members", "signatures"):
            if name in record and not isinstance(record[name], list):
                raise GapsFileError(f"{path}: gaps[{i}] ({record['id']}): '{name}' must be a list")
        try:
            gaps.append(Gap.from_dict(record))
        except GapError as exc:
            unusable.append({"gap_id": record["id"], "name": record.get("name"),
                             "detector": None, "reason": str(exc)})  # fmt: skip
    return gaps, unusable


def load_gaps(path: str | Path) -> list[Gap]:
    """The gaps of a gaps.json document that are usable (see `read_gaps`)."""
    return read_gaps(path)[0]


@dataclass
class SynthesisReport:
    home: str
    gaps_path: str
    environments: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)  # built, failed validity
    not_synthesizable: list[dict[str, Any]] = field(default_factory=list)
    catalog_source: str = ""
    conventions: dict[str, Any] = field(default_factory=dict)  # what environments follow

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _gap_ref(gap: Gap) -> dict[str, Any]:
    return {"gap_id": gap.id, "name": gap.name, "detector": gap.detector}


def _store_catalog(home: Path) -> Catalog | None:
    if not (home / "lake").exists() and not (home / "spool").exists():
        return None
    try:
        catalog = catalog_from_store(home)
    except ImportError:
        return None
    return catalog if catalog.tools else None


def _store_conventions(home: Path) -> Conventions:
    if not (home / "lake").exists() and not (home / "spool").exists():
        return Conventions()
    try:
        return conventions_from_store(home)
    except ImportError:
        return Conventions()


def synthesize(
    home: str | Path,
    gaps_path: str | Path | None = None,
    policy: Policy | Callable[[], Policy] | None = None,
    *,
    catalog: Catalog | None = None,
    conventions: Conventions | None = None,
    n_train: int = 500,
    n_heldout: int = 200,
    validity_seeds: int = 200,
    calibration_seeds: int = 40,
    k: int = 4,
    policy_name: str | None = None,
) -> SynthesisReport:
    """Turn each gap of `gaps_path` (default `<home>/gaps.json`) into a registered environment.

    `policy` (a callable, or a zero-argument factory of one) calibrates the knobs; without it
    each family's default knobs are kept. `catalog` overrides the tools inferred from the store,
    `conventions` the agent's conventions mined from it (see synthesis.conventions).
    """
    home = Path(home)
    gaps_file = Path(gaps_path) if gaps_path is not None else home / "gaps.json"
    gaps, unusable = read_gaps(gaps_file)
    report = SynthesisReport(str(home), str(gaps_file))
    report.not_synthesizable.extend(unusable)
    store_catalog = catalog if catalog is not None else _store_catalog(home)
    report.catalog_source = (
        "given"
        if catalog is not None
        else f"store ({store_catalog.traces} traces)"
        if store_catalog
        else "the gaps' argument patterns"
    )
    if conventions is None:
        conventions = _store_conventions(home)
    report.conventions = conventions.to_dict()
    for gap in gaps:
        ref = _gap_ref(gap)
        try:
            family_for_gap(gap)
            gap_catalog = store_catalog or catalog_from_patterns(
                list(gap.argument_patterns), list(gap.tools)
            )
            spec = build_spec(gap, gap_catalog, conventions)
        except NotSynthesizable as exc:
            report.not_synthesizable.append({**ref, "reason": str(exc)})
            continue
        except Exception as exc:  # a gap we did not foresee must not stop the others
            report.not_synthesizable.append(
                {**ref, "reason": f"building the environment failed: {type(exc).__name__}: {exc}"}
            )
            continue
        try:
            env = from_spec(spec)
            calibration = None
            if policy is not None:
                chosen = policy() if _is_factory(policy) else policy
                result = calibrate(env, chosen, n_seeds=calibration_seeds, k=k)
                calibration = {**result.to_dict(), "policy": policy_name or _name(chosen)}
                env = from_spec(spec, **result.knobs)
            validity = check_environment(env, validity_seeds)
            if not validity.ok:
                report.rejected.append(
                    {
                        **ref,
                        "env_id": spec.env_id,
                        "family": spec.family,
                        "failures": validity.failures,
                    }
                )
                unregister(home, spec.env_id, missing_ok=True)
                continue
            path = register(
                home,
                env,
                validity=validity,
                calibration=calibration,
                n_train=n_train,
                n_heldout=n_heldout,
            )
        except Exception as exc:
            report.rejected.append(
                {
                    **ref,
                    "env_id": spec.env_id,
                    "family": spec.family,
                    "failures": [f"{type(exc).__name__}: {exc}"],
                }
            )
            continue
        report.environments.append(
            {
                **ref,
                "env_id": spec.env_id,
                "family": spec.family,
                "path": str(path),
                "action": spec.roles.get("action"),
                "knobs": env.knobs,
                "validity": {c.name: c.detail for c in validity.checks},
                "calibration": None
                if calibration is None
                else {
                    k_: calibration[k_]
                    for k_ in ("pass_at_1", "pass_at_k", "k", "in_band", "policy")
                },
            }
        )
    return report


def _is_factory(policy: Any) -> bool:
    """A zero-argument callable (a policy class or factory) rather than a policy."""
    if isinstance(policy, type):
        return True
    import inspect

    try:
        params = inspect.signature(policy).parameters.values()
    except (TypeError, ValueError):
        return False
    required = [
        p
        for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return not required


def _name(policy: Any) -> str:
    return getattr(policy, "__name__", None) or type(policy).__name__


__all__ = ["GapsFileError", "SynthesisReport", "load_gaps", "read_gaps", "synthesize"]
