"""The `medagentbench` importer: text commands (`GET`, `POST`, `FINISH`) become tool calls and a
final answer, statuses become outcomes, and hostile input is a format error naming the file and
record. Small documents written here; one test reads the shared data and skips without it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracegym.analysis.tool_kinds import is_read_tool
from tracegym.store.importers import FORMATS, ImportFormatError, converter, import_path
from tracegym.store.importers import medagentbench as mab
from tracegym.tracer import semconv as sc

DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "medagentbench"
BASE = "http://fhir.example/fhir"
PROMPT = "You are an expert ... functions [...]\n\nContext: It's 2023-11-13 now.\nQuestion: {q}"


def _result(index: int, status: str, turns: list[tuple[str, str]], result: str | None) -> dict:
    history = [{"role": "user", "content": PROMPT.format(q=f"task {index}?")}]
    history += [{"role": r, "content": c} for r, c in turns]
    return {"index": index, "status": status, "result": result, "history": history}


def _doc() -> dict[str, Any]:
    lookup = f"GET {BASE}/Observation?code=MG&patient=S1&date=ge2023&date=le2024"
    order = f'POST {BASE}/MedicationRequest\n{{"resourceType": "MedicationRequest", "dose": 2}}'
    return {
        "total": 3,
        "custom": {
            "accuracy": 1 / 3,
            "raw_results": [
                _result(0, "completedCorrect", [
                    ("agent", lookup),
                    ("user", 'Here is the response from the GET request:\n{"total": 1}'),
                    ("agent", "FINISH([2.1])"),
                ], "[2.1]"),
                _result(1, "completedIncorrect", [
                    ("agent", f"```\nGET {BASE}/Patient?name=x&_sort=-date\n```"),
                    ("user", "Error in sending the GET request: 400 Client Error"),
                    ("agent", order),
                    ("user", "POST request accepted and executed successfully."),
                    ("agent", f"POST {BASE}/ServiceRequest\n{{\"code\": "),
                    ("user", "Invalid POST request"),
                    ("agent", "FINISH([-1])"),
                ], "[-1]"),
                _result(2, "agent invalid action", [
                    ("agent", lookup),
                    ("user", "Here is the response from the GET request: {}"),
                    ("agent", "The value is 2.1, no order is needed."),
                ], None),
            ],
        },
    }  # fmt: skip


def _write(folder: Path, doc: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "overall.json"
    path.write_text(json.dumps(doc))
    return path


def _convert(path: Path) -> list[dict[str, Any]]:
    return mab.convert(path, path.read_bytes())


def _by_trace(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Records grouped by the run's source index."""
    index: dict[str, int] = {}
    for r in records:
        if r["parent_span_id"] is None and r["name"] != sc.OUTCOME_SPAN_NAME:
            index[r["trace_id"]] = index[r["attributes"][sc.RUN_ID]] = r["attributes"][
                "tracegym.source.index"
            ]
    out: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        owner = r["attributes"].get(sc.OUTCOME_TARGET, r["trace_id"])
        out.setdefault(index[owner], []).append(r)
    return out


def _tools(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["attributes"].get(sc.OPERATION) == sc.OP_TOOL]


def test_registered_for_json_files() -> None:
    assert FORMATS["medagentbench"][1] == (".json",)
    assert converter("medagentbench") is mab.convert


def test_commands_become_tool_calls_with_arguments_and_results(tmp_path: Path) -> None:
    runs = _by_trace(_convert(_write(tmp_path / "gpt-x" / "medagentbench-std", _doc())))
    assert sorted(runs) == [0, 1, 2]
    (get,) = _tools(runs[0])
    assert get["name"] == "execute_tool get_Observation"
    assert json.loads(get["attributes"][sc.TOOL_ARGUMENTS]) == {
        "code": "MG", "patient": "S1", "date": ["ge2023", "le2024"]}  # fmt: skip
    assert get["attributes"][sc.TOOL_RESULT].startswith("Here is the response")
    assert get["attributes"][sc.STEP_INDEX] == 2 and get["status"] == "UNSET"
    names = [t["attributes"][sc.TOOL_NAME] for t in _tools(runs[1])]
    assert names == ["get_Patient", "post_MedicationRequest", "post_ServiceRequest"]
    assert [is_read_tool(n) for n in names] == [True, False, False]
    patient, order, bad = _tools(runs[1])
    assert json.loads(patient["attributes"][sc.TOOL_ARGUMENTS]) == {"name": "x", "_sort": "-date"}
    assert patient["status"] == "ERROR" and "400" in patient["status_message"]
    assert json.loads(order["attributes"][sc.TOOL_ARGUMENTS])["dose"] == 2
    assert order["status"] == "UNSET"
    assert bad["status"] == "ERROR" and bad["attributes"][sc.TOOL_ARGUMENTS] == '{"code":'


def test_turns_keep_their_positions_and_finish_is_the_answer(tmp_path: Path) -> None:
    doc = _doc()
    runs = _by_trace(_convert(_write(tmp_path / "gpt-x" / "medagentbench-std", doc)))
    for index, records in runs.items():
        history = doc["custom"]["raw_results"][index]["history"]
        steps = sorted(r["attributes"][sc.STEP_INDEX] for r in records
                       if sc.STEP_INDEX in r["attributes"])  # fmt: skip
        assert steps == list(range(len(history)))  # one span per turn, at its position
    root = next(r for r in runs[1] if r["parent_span_id"] is None and r["name"].startswith("inv"))
    assert root["attributes"][sc.OUTPUT] == "[-1]"
    assert root["attributes"][sc.INPUT].startswith("Context:")  # not the function list
    chats = [r for r in runs[1] if r["attributes"].get(sc.OPERATION) == sc.OP_CHAT]
    assert {c["name"] for c in chats} == {"chat gpt-x"} and len(chats) == 4
    assert all(c["status"] == "UNSET" for c in chats)


def test_invalid_action_is_an_error_and_statuses_are_outcomes(tmp_path: Path) -> None:
    runs = _by_trace(_convert(_write(tmp_path / "llama" / "medagentbench-std", _doc())))
    last = next(r for r in runs[2] if r["attributes"].get(sc.STEP_INDEX) == 3)
    assert last["attributes"][sc.OPERATION] == sc.OP_CHAT and last["status"] == "ERROR"
    assert last["attributes"][sc.ERROR_TYPE] == mab.INVALID_ACTION
    outcomes = {i: next(r for r in rs if r["name"] == sc.OUTCOME_SPAN_NAME)
                for i, rs in runs.items()}  # fmt: skip
    success = {i: o["attributes"].get(sc.OUTCOME_SUCCESS) for i, o in outcomes.items()}
    assert success == {0: True, 1: False, 2: False}
    labels = json.loads(outcomes[2]["attributes"][sc.OUTCOME_LABELS])
    assert labels["status"] == "agent invalid action"
    assert mab.success_of("task error") is None  # no verdict on the agent


def test_model_is_the_folder_and_part_of_the_identity(tmp_path: Path) -> None:
    doc = _doc()
    a = _write(tmp_path / "outputs" / "model-a" / "medagentbench-std", doc)
    b = _write(tmp_path / "outputs" / "model-b" / "medagentbench-std", doc)
    assert mab.model_of(a) == "model-a" and mab.model_of(tmp_path / "m" / "x.json") == "m"
    ids_a = {r["trace_id"] for r in _convert(a)}
    assert ids_a == {r["trace_id"] for r in _convert(a)}  # stable
    assert not ids_a & {r["trace_id"] for r in _convert(b)}  # same history, other model
    report = import_path("medagentbench", tmp_path / "outputs", tmp_path / "home")
    assert (report.files, report.runs, report.repeated_runs) == (2, 6, 0)


def test_history_as_a_python_literal_string(tmp_path: Path) -> None:
    doc = _doc()
    for item in doc["custom"]["raw_results"]:
        item["history"] = repr(item["history"])
    literal = _convert(_write(tmp_path / "a" / "m", doc))
    plain = _convert(_write(tmp_path / "b" / "m", _doc()))
    assert [r["name"] for r in literal] == [r["name"] for r in plain]


def _hostile() -> dict[str, tuple[Any, str]]:
    deep = "[" * 3000 + "]" * 3000

    def with_result(value: Any) -> dict:
        return {"custom": {"raw_results": [value]}}

    good = _doc()["custom"]["raw_results"][0]
    return {
        "not an object": ("text", "expected a MedAgentBench overall.json object"),
        "no raw_results": ({"custom": {}}, "custom.raw_results"),
        "result not an object": (with_result([1]), "record result 0"),
        "no status": (with_result({**good, "status": None}), "missing field 'status'"),
        "status a number": (with_result({**good, "status": 3}), "'status' should be text"),
        "index a list": (with_result({**good, "index": [1]}), "index should be an integer"),
        "result a dict": (with_result({**good, "result": {"a": 1}}), "'result' should be text"),
        "history a number": (with_result({**good, "history": 5}), "'history' should be a list"),
        "history empty": (with_result({**good, "history": []}), "'history' is empty"),
        "history code": (with_result({**good, "history": "__import__('os')"}),
                         "not a Python literal"),
        "history deep": (with_result({**good, "history": deep}), "not a Python literal"),
        "turn a list": (with_result({**good, "history": [[1]]}), "history 0"),
        "content a dict": (with_result({**good, "history": [{"role": "user", "content": {}}]}),
                           "'content' should be text"),
    }  # fmt: skip


@pytest.mark.parametrize("case", sorted(_hostile()))
def test_hostile_input_is_a_format_error_naming_file_and_record(tmp_path: Path, case: str):
    doc, message = _hostile()[case]
    path = _write(tmp_path / "m" / "medagentbench-std", doc)
    with pytest.raises(ImportFormatError) as caught:
        _convert(path)
    assert str(path) in str(caught.value) and message in str(caught.value)
    if case not in ("not an object", "no raw_results"):
        assert "(record result 0" in str(caught.value)


def test_deeply_nested_file_imports_nothing(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text('{"custom":' * 3000 + "1" + "}" * 3000)
    with pytest.raises(ImportFormatError, match="nested too deeply"):
        import_path("medagentbench", path, tmp_path / "home")
    assert not (tmp_path / "home" / "spool").exists()


_KEYS = st.sampled_from(["role", "content", "status", "history", "index"])
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_KEYS, children, max_size=3),
    max_leaves=10,
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            out += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out += _paths(item, (*prefix, index))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_input_gives_records_or_a_format_error(data: Any) -> None:
    doc = _doc()
    where = data.draw(st.sampled_from(_paths(doc)))
    target: Any = doc
    for step in where[:-1]:
        target = target[step]
    if where and data.draw(st.booleans()):
        del target[where[-1]]
    elif where:
        target[where[-1]] = data.draw(_VALUES)
    else:
        doc = data.draw(_VALUES)
    path = Path("/nonexistent/m/fuzz.json")
    try:
        records = mab.convert(path, json.dumps(doc).encode())
    except ImportFormatError as exc:
        assert str(path) in str(exc)
    else:
        assert all(r["trace_id"] and r["span_id"] for r in records)


@pytest.mark.skipif(not DATA.is_dir(), reason=f"MedAgentBench data not found at {DATA}")
def test_the_shared_runs(tmp_path: Path) -> None:
    files = sorted(DATA.rglob("overall.json"))
    assert files
    for path in files:
        doc = json.loads(path.read_text())["custom"]["raw_results"]
        records = _convert(path)
        outcomes = [r for r in records if r["name"] == sc.OUTCOME_SPAN_NAME]
        assert len(outcomes) == len(doc)
        correct = sum(r["status"] == "completedCorrect" for r in doc)
        assert sum(o["attributes"].get(sc.OUTCOME_SUCCESS) is True for o in outcomes) == correct
        commands = sum(t["role"] == "agent" and t["content"].strip().startswith(("GET", "POST"))
                       for r in doc for t in r["history"])  # fmt: skip
        assert len(_tools(records)) == commands
        invalid = [r for r in records if r["attributes"].get(sc.ERROR_TYPE) == mab.INVALID_ACTION]
        assert len(invalid) == sum(r["status"] == "agent invalid action" for r in doc)
        assert {r["name"] for r in records if r["name"].startswith("chat ")} == {
            f"chat {path.parent.parent.name}"}  # fmt: skip


@pytest.mark.skipif(not DATA.is_dir(), reason=f"MedAgentBench data not found at {DATA}")
def test_index_tens_are_the_task_templates() -> None:
    """benchmarks/gaps_real.py groups runs by `task_kind(index)` = index // 10: on the shared
    data every group of ten holds one question template, and the ten groups ten templates."""
    from tracegym.benchmarks.gaps_real import task_kind

    def template(prompt: str) -> str:
        words = prompt.split("Question:")[-1].replace("’", "'").lower().split()
        return " ".join([w for w in words if not any(c.isdigit() for c in w)][:4])

    kinds: dict[str, set[str]] = {}
    for path in sorted(DATA.rglob("overall.json")):
        for item in json.loads(path.read_text())["custom"]["raw_results"]:
            kind = task_kind(item["index"])
            kinds.setdefault(kind, set()).add(template(item["history"][0]["content"]))
    assert len(kinds) == 10 and all(len(t) == 1 for t in kinds.values())
    assert len(set().union(*kinds.values())) == 10
    assert task_kind(True) is None and task_kind("3") is None


def test_gaps_real_scores_gaps_against_statuses_and_task_kinds(tmp_path: Path) -> None:
    from types import SimpleNamespace as NS

    from tracegym.benchmarks import gaps_real

    def run(trace: str, index: int, status: str) -> NS:
        attrs = {"tracegym.source.index": index, "tracegym.source.status": status}
        return NS(trace_id=trace, root=NS(attributes=attrs))

    failed = [run("a", 60, "completedIncorrect"), run("b", 61, "agent invalid action"),
              run("c", 5, "completedIncorrect"), run("d", 7, "completedIncorrect")]  # fmt: skip
    result = NS(failed=failed, succeeded=[run("e", 62, "completedCorrect"), run("f", 1, "x")])
    row = gaps_real.GapRow(1, "g", "d", 0.5, 0.5, 2, 0, [], "")
    summary = gaps_real.evaluate_medagentbench(result, [row], [NS(failed_members={"a", "b"})])
    assert row.evaluation["top_task_kind"] == "task7" and row.evaluation["lift"] == 2.0
    assert row.evaluation["top_kind_failed"] == "2/3"
    assert dict(row.evaluation["statuses"]) == {"completedIncorrect": 1, "agent invalid action": 1}
    assert dict(summary["failed_task_kinds"]) == {"task7": 2, "task1": 2}
    _, skipped = gaps_real.real_sets(tmp_path)
    assert any(line.startswith("MedAgentBench") for line in skipped)
    if DATA.is_dir():
        found, _ = gaps_real.real_sets(DATA.parent.resolve())
        names = [s.name for s in found if s.fmt == "medagentbench"]
        assert len(names) == 5 and any("pooled" in n for n in names)
