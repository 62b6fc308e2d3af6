"""The clinic's tools refuse rule breaks, and its verifier fails the runs that break them."""

from __future__ import annotations

import json

from tracegym.examples import clinic
from tracegym.examples.clinic import Clinic, make_task, oracle_actions, oracle_answer, verify


def _task(kind: str, booked: bool | None = None, start: int = 0) -> clinic.ClinicTask:
    """The first task of `kind` from `start` (whose appointment is booked or not, if given)."""
    for seed in range(start, start + 1000):
        task = make_task(seed, (kind,))
        if booked is None:
            return task
        if (task.appointments[task.appointment_id]["status"] == "booked") == booked:
            return task
    raise AssertionError("no such task")


def _run(task: clinic.ClinicTask, calls: list[tuple[str, dict]]) -> tuple[Clinic, list[str]]:
    tools = Clinic(task)
    return tools, [tools.call(name, arguments) for name, arguments in calls]


def test_nothing_before_the_patient_is_found():
    task = _task("when")
    _, results = _run(task, [("get_appointment", {"appointment_id": task.appointment_id})])
    assert results == ["Error: find the patient with find_patient first"]


def test_only_booked_appointments_are_cancelled_and_a_try_fails_the_run():
    task = _task("cancel", booked=False)
    status = task.appointments[task.appointment_id]["status"]
    calls = [*oracle_actions(task), ("cancel_appointment", {"appointment_id": task.appointment_id})]
    tools, results = _run(task, calls)
    assert results[-1] == (f"Error: appointment {task.appointment_id} is {status}; "
                           "only booked appointments can be cancelled")  # fmt: skip
    assert tools.db == clinic.expected_database(task)  # refused: nothing changed
    verdict = verify(task, tools, oracle_answer(task))
    assert not verdict.passed and verdict.reward == 0.75
    assert verdict.reasons == [f"a change the rules forbid was tried (cancel_appointment: "
                               f"appointment {task.appointment_id} is {status}; only booked "
                               "appointments can be cancelled)"]  # fmt: skip


def test_cancel_needs_the_look_up_first():
    task = _task("cancel", booked=True)
    calls = [("find_patient", {"phone": task.phone}),
             ("cancel_appointment", {"appointment_id": task.appointment_id})]  # fmt: skip
    _, results = _run(task, calls)
    assert results[-1] == (
        f"Error: look appointment {task.appointment_id} up with get_appointment first"
    )


def test_a_slot_must_be_listed_before_it_is_booked():
    task = _task("book")
    calls = [("find_patient", {"phone": task.phone}),
             ("book_slot", {"patient_id": task.patient_id, "slot_id": task.slot_id})]  # fmt: skip
    _, results = _run(task, calls)
    assert results[-1] == (
        f"Error: list the doctor's slots with list_slots before using {task.slot_id}"
    )


def test_booking_the_first_slot_instead_of_the_day_asked_for_fails():
    task = next(t for t in (make_task(s, ("book",)) for s in range(100))
                if sorted(t.slots)[0] != t.slot_id)  # fmt: skip
    calls = oracle_actions(task)
    listed = json.loads(_run(task, calls[:2])[1][1])["slots"]
    assert [s["slot_id"] for s in listed] == sorted(task.slots)
    wrong = listed[0]["slot_id"]  # the first listed, not the one of the day asked for
    tools, results = _run(task, [*calls[:2], ("book_slot", {"patient_id": task.patient_id,
                                                            "slot_id": wrong})])  # fmt: skip
    assert not results[-1].startswith("Error")
    verdict = verify(task, tools, oracle_answer(task))
    assert verdict.reasons == ["the final database is not the expected one"]


def test_a_move_to_another_doctors_slot_is_refused():
    task = _task("move", booked=True)
    other = next(s for s in range(1000) if make_task(s, ("book",)).doctor != task.doctor)
    stranger = make_task(other, ("book",))
    tools = Clinic(task)
    tools.db["slots"].update(stranger.slots)
    tools.listed.update(stranger.slots)
    tools.call("find_patient", {"phone": task.phone})
    tools.call("get_appointment", {"appointment_id": task.appointment_id})
    slot = sorted(stranger.slots)[0]
    result = tools.call("reschedule", {"appointment_id": task.appointment_id, "slot_id": slot})
    assert result.startswith(f"Error: slot {slot} is {stranger.doctor}'s")


def test_the_when_answer_must_give_the_day_and_the_time():
    task = _task("when")
    tools, _ = _run(task, oracle_actions(task))
    day = task.appointments[task.appointment_id]["day"]
    assert verify(task, tools, oracle_answer(task)).passed
    assert not verify(task, tools, f"It is on {day}.").passed
    assert not verify(task, tools, "").passed
    # "June 1" is not said by "June 12"
    wrong = {**task.appointments[task.appointment_id], "day": "June 1"}
    task.appointments[task.appointment_id] = wrong
    tools, _ = _run(task, oracle_actions(task))
    assert not verify(task, tools, f"On June 12 at {wrong['time']}.").passed
    assert verify(task, tools, f"On June 1 at {wrong['time']}.").passed


def test_a_skipped_look_up_is_named():
    task = _task("when")
    tools, _ = _run(task, oracle_actions(task)[:1])
    verdict = verify(task, tools, oracle_answer(task))
    assert verdict.reasons == [f"get_appointment({task.appointment_id}) was never called"]
