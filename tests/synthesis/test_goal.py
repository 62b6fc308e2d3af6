"""The typed goal of a task: its parts are fields, a typo is an error, not a check that never
runs."""

from __future__ import annotations

import pytest
from tracegym.synthesis.base import Task
from tracegym.synthesis.goal import Goal


def test_a_task_given_the_parts_of_a_goal_holds_a_goal() -> None:
    call = {"name": "cancel", "arguments": {"id": "A-1"}}
    read = {"name": "get", "arguments": {"id": "A-1"}}
    task = Task(1, "cancel A-1", {}, {"required_calls": [call], "order": [[read, call]]}, [], 4)
    assert isinstance(task.goal, Goal)
    assert task.goal.required_calls == [call] and task.goal.order == [(read, call)]
    assert task.goal.to_dict() == {"required_calls": [call], "order": [[read, call]]}
    assert Goal.from_dict(task.goal.to_dict()) == task.goal


def test_an_unknown_goal_part_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="answer_include"):
        Task(1, "x", {}, {"answer_include": ["done"]}, [], 4)


def test_max_invalid_zero_is_a_part_of_the_goal() -> None:
    assert Goal(max_invalid=0).to_dict() == {"max_invalid": 0}
    assert Goal().to_dict() == {}
