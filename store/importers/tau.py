"""`tau-bench` and `tau2-bench` results files -> one trace per run, with its reward as outcome.

Success is a full reward, or, where a run's `info.reward_info.components.base_success` is given
(a `reward` that is a composite of success, efficiency penalties and bonuses), that base success.

tau-bench: a JSON list of runs `{task_id, trial, reward, info{task{user_id, instruction,
actions}, reward_info}, traj[OpenAI messages]}` (the AgentRx `tau_dataset_*.json` files too).
tau2-bench: a JSON object `{info{agent_info, environment_info ...}, tasks[...],
simulations[{id, task_id, trial, start_time, end_time, termination_reason, reward_info{reward},
messages[...]}]}`.

Messages map as in `tracegym.store.importers.chat` (docs/importers.md has the full table). With
`labels=` (AgentRx `tau_ground_truth.json` style) the named runs' outcomes carry the labels and
the labelled steps' spans carry `tracegym.label.*` attributes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from tracegym.store.importers import ImportFormatError, load_json
from tracegym.store.importers.chat import (
    ImportedRun,
    RunLabels,
    as_text,
    convert_messages,
    describe,
    guarded,
    hint,
    is_full_reward,
    keyed,
    load_agentrx_labels,
    match_labels,
    optional_number,
    parse_time_ns,
    source_attrs,
    synthetic_start,
)
from tracegym.tracer import semconv as sc

TAU_AGENT = "tau-bench"
TAU2_AGENT = "tau2-bench"


def _task_id(path: Path, run: Mapping[str, Any], where: str) -> Any:
    task_id = run.get("task_id")
    if task_id is None:
        raise ImportFormatError(path, "missing field 'task_id'", record=where)
    if isinstance(task_id, bool) or not isinstance(task_id, (int, str)):
        raise ImportFormatError(
            path, f"task_id should be an integer or text, got {describe(task_id)}", record=where
        )
    return task_id


def _trial(path: Path, run: Mapping[str, Any], where: str) -> int | str:
    trial = run.get("trial", 0)
    if trial is None:
        return 0
    if isinstance(trial, bool) or not isinstance(trial, (int, str)):
        raise ImportFormatError(
            path, f"trial should be an integer, got {describe(trial)}", record=where
        )
    return trial


def _labels(labels: Path | None) -> dict[str, RunLabels]:
    return load_agentrx_labels(labels) if labels is not None else {}


def base_success(info: Mapping[str, Any]) -> float | None:
    """`info.reward_info.components.base_success`: the pass/fail of runs whose `reward` is a
    composite with efficiency penalties and bonuses (tau-bench's grok-3 results), else None."""
    reward_info = info.get("reward_info")
    components = reward_info.get("components") if isinstance(reward_info, Mapping) else None
    value = components.get("base_success") if isinstance(components, Mapping) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _finish(
    run: ImportedRun,
    *,
    reward: float | None,
    source: str,
    labels: RunLabels | None,
    passed: float | None = None,
) -> list[dict[str, Any]]:
    """The run's outcome: success from `passed` (a base success) when given, else the reward."""
    if labels is not None:
        run.mark_failures(labels.failures)
    if reward is not None or labels is not None or passed is not None:
        run.outcome(
            success=is_full_reward(passed if passed is not None else reward),
            reward=reward,
            source=source,
            labels=labels.outcome_labels() if labels is not None else None,
            labelled=labels is not None,
        )
    return run.records


# tau-bench -------------------------------------------------------------------------------------


def convert(path: Path, data: bytes, *, labels: Path | None = None) -> list[dict[str, Any]]:
    """A tau-bench results file (a list of runs) -> spool records."""
    return list(iter_records(path, data, labels=labels))


def iter_records(
    path: Path, data: bytes, *, labels: Path | None = None
) -> Iterator[dict[str, Any]]:
    """`convert`'s records a run at a time (every run is checked before the first)."""
    runs = load_json(path, data)
    if isinstance(runs, Mapping) and "traj" in runs:  # a single run
        runs = [runs]
    if not isinstance(runs, list):
        raise ImportFormatError(
            path, f"expected a JSON list of tau-bench runs, got {describe(runs)}{hint(runs)}"
        )
    checked = []
    for i, run in enumerate(runs):
        where = f"run {i}"
        if not isinstance(run, Mapping):
            raise ImportFormatError(
                path, f"expected a run object, got {describe(run)}{hint(run)}", record=where
            )
        if not isinstance(run.get("traj"), list):
            problem = "missing field 'traj'" if "traj" not in run else "'traj' should be a list"
            raise ImportFormatError(path, f"{problem}{hint(run)}", record=where)
        task_id = _task_id(path, run, where)
        trial = _trial(path, run, where)
        if "reward" not in run:
            raise ImportFormatError(path, "missing field 'reward'", record=where)
        reward = optional_number(path, run, "reward", where)
        checked.append((f"run {i} (task_id {task_id})", task_id, trial, reward))
    matched = match_labels(
        path,
        _labels(labels),
        [([f"{t}-{n}", str(t)], f"task {t} trial {n}") for _, t, n, _ in checked],
    )
    seen: dict[str, int] = {}
    for i, (run, (where, task_id, trial, reward)) in enumerate(zip(runs, checked, strict=True)):
        key = keyed("tau-bench", run, seen)
        yield from guarded(
            path, where, _tau_run, path, where, run, key, task_id, trial, reward, matched.get(i)
        )


def _tau_run(
    path: Path,
    where: str,
    source: Mapping[str, Any],
    key: str,
    task_id: Any,
    trial: Any,
    reward: float | None,
    labels: RunLabels | None,
) -> list[dict[str, Any]]:
    info = source.get("info") if isinstance(source.get("info"), Mapping) else {}
    task = info.get("task") if isinstance(info.get("task"), Mapping) else {}
    run = ImportedRun("tau-bench", key, f"tau-bench/{task_id}-{trial}/{key[:8]}", TAU_AGENT)
    start = synthetic_start(key)
    summary = convert_messages(
        run, path, where, source["traj"], start_ns=start, source_index="index"
    )
    run.root(
        start,
        run.end_ns() if run.records else start,
        {
            sc.INPUT: task.get("instruction") if isinstance(task.get("instruction"), str) else None,
            sc.OUTPUT: summary.last_assistant,
            **source_attrs(
                task_id=task_id,
                trial=trial,
                user_id=task.get("user_id"),
                task=task or None,
                reward_info=info.get("reward_info"),
            ),
        },
    )
    return _finish(run, reward=reward, source="tau-bench", labels=labels, passed=base_success(info))


# tau2-bench ------------------------------------------------------------------------------------


def convert_tau2(path: Path, data: bytes, *, labels: Path | None = None) -> list[dict[str, Any]]:
    """A tau2-bench results file (`{info, tasks, simulations}`) -> spool records."""
    doc = load_json(path, data)
    if not isinstance(doc, Mapping) or not isinstance(doc.get("simulations"), list):
        raise ImportFormatError(
            path,
            "expected a tau2-bench results object with a 'simulations' list, "
            f"got {describe(doc)}{hint(doc)}",
        )
    info = doc.get("info") if isinstance(doc.get("info"), Mapping) else {}
    agent_info = info.get("agent_info") if isinstance(info.get("agent_info"), Mapping) else {}
    environment = (
        info.get("environment_info") if isinstance(info.get("environment_info"), Mapping) else {}
    )
    agent = agent_info.get("implementation")
    agent = agent if isinstance(agent, str) and agent else TAU2_AGENT
    model = agent_info.get("llm") if isinstance(agent_info.get("llm"), str) else None
    tasks = {
        str(t.get("id")): t
        for t in (doc.get("tasks") or [])
        if isinstance(t, Mapping) and t.get("id") is not None
    }
    simulations = doc["simulations"]
    checked = []
    for i, sim in enumerate(simulations):
        where = f"simulation {i}"
        if not isinstance(sim, Mapping):
            raise ImportFormatError(path, f"expected an object, got {describe(sim)}", record=where)
        if not isinstance(sim.get("messages"), list):
            problem = "missing field 'messages'" if "messages" not in sim else "bad 'messages'"
            raise ImportFormatError(path, problem, record=where)
        task_id = _task_id(path, sim, where)
        trial = _trial(path, sim, where)
        reward_info = sim.get("reward_info")
        if reward_info is not None and not isinstance(reward_info, Mapping):
            raise ImportFormatError(path, "reward_info should be an object", record=where)
        reward = optional_number(path, reward_info, "reward", where) if reward_info else None
        checked.append((f"{where} (task_id {task_id})", task_id, trial, reward))
    names = []
    for sim, (_, task_id, trial, _) in zip(simulations, checked, strict=True):
        ids = [f"{task_id}-{trial}", str(task_id)]
        if sim.get("id") is not None:
            ids.insert(0, str(sim["id"]))
        names.append((ids, f"task {task_id} trial {trial}"))
    matched = match_labels(path, _labels(labels), names)
    records: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for i, (sim, (where, task_id, trial, reward)) in enumerate(
        zip(simulations, checked, strict=True)
    ):
        key = keyed("tau2-bench", sim, seen)
        task = tasks.get(str(task_id), {})
        records += guarded(
            path,
            where,
            _tau2_run,
            path,
            where,
            sim,
            key,
            (task_id, trial, reward),
            task,
            agent,
            model,
            environment.get("domain_name"),
            matched.get(i),
        )
    return records


def _tau2_run(
    path: Path,
    where: str,
    sim: Mapping[str, Any],
    key: str,
    ident: tuple[Any, Any, float | None],
    task: Mapping[str, Any],
    agent: str,
    model: str | None,
    domain: Any,
    labels: RunLabels | None,
) -> list[dict[str, Any]]:
    task_id, trial, reward = ident
    messages = sim["messages"]
    stamps = [
        parse_time_ns(m.get("timestamp")) if isinstance(m, Mapping) else None for m in messages
    ]
    start = parse_time_ns(sim.get("start_time"))
    if start is None:
        start = next((s for s in stamps if s is not None), None)
    if start is None:
        start = synthetic_start(key)
    run = ImportedRun("tau2-bench", key, f"tau2-bench/{task_id}-{trial}/{key[:8]}", agent)
    summary = convert_messages(
        run,
        path,
        where,
        messages,
        start_ns=start,
        stamps=stamps,
        model=model,
        source_index="turn_idx",
    )
    end = run.end_ns() if run.records else start
    stated_end = parse_time_ns(sim.get("end_time"))
    if stated_end is not None and stated_end > end:
        end = stated_end
    scenario = task.get("user_scenario") if isinstance(task.get("user_scenario"), Mapping) else {}
    instructions = scenario.get("instructions")
    run.root(
        start,
        end,
        {
            sc.INPUT: as_text(instructions),
            sc.OUTPUT: summary.last_assistant,
            **source_attrs(
                task_id=task_id,
                trial=trial,
                simulation_id=sim.get("id"),
                domain=domain,
                termination_reason=sim.get("termination_reason"),
                reward_info=sim.get("reward_info"),
            ),
        },
    )
    return _finish(run, reward=reward, source="tau2-bench", labels=labels)
