"""A small simulated clinic front desk: seeded database, tools, policy rules, tasks, verifier.

The demo's second bundled domain (the first is `examples/shop.py`): the same shape (one seeded
database per task, a patient with two or three appointments and a doctor's two or three free
slots), other tools, other rules, other ways to go wrong. The patient asks for one thing:

| kind   | the request                             | what the verifier wants                       |
|--------|-----------------------------------------|-----------------------------------------------|
| when   | "when is my appointment A1234?"         | look it up; the answer gives day and time     |
| cancel | "please cancel my appointment A1234"    | look it up; cancel it only if it is booked    |
| book   | "an appointment with Dr Lee on June 14" | list the doctor's slots; book the slot of the |
|        |                                         | day asked for (not the first one listed)      |
| move   | "please move my appointment A1234 to"   | look it up; if booked, list its doctor's      |
|        |                                         | slots, move it to the slot of the day asked   |

The rules the agent is told (`RULES`): find the patient by phone before anything else; look an
appointment up before cancelling or moving it; only booked appointments can be cancelled or
moved; list the doctor's slots before booking or moving, and use the slot id of the day asked
for. The tools enforce the preconditions and the state rule (a refused call returns
"Error: ..."); the verifier checks the final database against the one the oracle
(`oracle_actions`) leaves, the look-ups the request needs, the answer, and that no change was
refused (trying a change the rules forbid is a failure even though the tool stops it).
"""

from __future__ import annotations

import copy
import json
import random
import re
from dataclasses import dataclass
from typing import Any

import tracegym as tg
from tracegym.examples.shop import Verdict

KINDS = ("when", "cancel", "book", "move")
DEV_SEEDS = (0, 100_000)
DEMO_SEEDS = (500_000, 600_000)
HELDOUT_SEEDS = (1_000_000, 1_100_000)

RULES = (
    "You are the front desk of a clinic. Rules: first find the patient with find_patient using "
    "their phone number. Look an appointment up with get_appointment before you cancel or move "
    "it. Only booked appointments can be cancelled or moved. Before booking or moving, list the "
    "doctor's free slots with list_slots and use the slot_id of the day the patient asked for. "
    "When done, answer the patient in one short sentence."
)

_DOCTORS = ["Dr Lee", "Dr Kim", "Dr Patel", "Dr Ortiz", "Dr Novak", "Dr Silva"]
_TIMES = ["09:00", "10:30", "11:15", "14:00", "15:30", "16:45"]
_STATUSES = ("booked", "booked", "attended", "missed")  # half of the appointments are booked
WRITES = ("book_slot", "cancel_appointment", "reschedule")

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {arg: {"type": "string"} for arg in args},
                "required": list(args),
            },
        },
    }
    for name, args, description in [
        ("find_patient", ("phone",), "the patient's id and appointment ids"),
        ("get_appointment", ("appointment_id",), "an appointment's doctor, day, time and status"),
        ("list_slots", ("doctor",), "a doctor's free slots: slot_id, day and time"),
        ("book_slot", ("patient_id", "slot_id"), "book a free slot for the patient"),
        ("cancel_appointment", ("appointment_id",), "cancel a booked appointment"),
        ("reschedule", ("appointment_id", "slot_id"), "move a booked appointment to a free slot"),
    ]
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOL_SCHEMAS)


def _day(number: int) -> str:
    return f"June {number}"


class ClinicError(Exception):
    """A tool refused the call; the agent sees the message as the tool's result."""


@dataclass
class ClinicTask:
    """One patient request, generated from its seed."""

    seed: int
    kind: str
    phone: str
    patient_id: str
    appointments: dict[str, dict[str, str]]  # id -> {"doctor", "day", "time", "status"}
    doctor: str  # whose free slots the database holds (the one the request is about)
    slots: dict[str, dict[str, str]]  # slot id -> {"doctor", "day", "time"}
    new_id: str  # the id a booking gets
    appointment_id: str | None = None  # when, cancel, move: the appointment asked about
    day: str | None = None  # book, move: the day asked for

    @property
    def task_id(self) -> str:
        return f"clinic:{self.seed}"

    @property
    def request(self) -> str:
        hello = f"Hi, my phone is {self.phone}."
        return (
            hello
            + " "
            + {
                "when": f"When is my appointment {self.appointment_id}?",
                "cancel": f"Please cancel my appointment {self.appointment_id}.",
                "book": f"I need an appointment with {self.doctor} on {self.day}.",
                "move": f"Please move my appointment {self.appointment_id} to {self.day}.",
            }[self.kind]
        )

    @property
    def slot_id(self) -> str | None:
        """The free slot of the day asked for (book, move), the one the oracle takes."""
        return next((s for s, slot in self.slots.items() if slot["day"] == self.day), None)

    def database(self) -> dict[str, Any]:
        return {
            "patients": {self.patient_id: {"phone": self.phone}},
            "appointments": copy.deepcopy(self.appointments),
            "slots": copy.deepcopy(self.slots),
        }


def make_task(seed: int, kinds: tuple[str, ...] = KINDS, weights: Any = None) -> ClinicTask:
    """The task for `seed`: kinds drawn uniformly unless `weights` says otherwise."""
    rng = random.Random(seed)
    kind = rng.choices(list(kinds), weights=weights)[0]
    appointments: dict[str, dict[str, str]] = {}
    n_appointments = rng.randint(2, 3)
    while len(appointments) < n_appointments:
        appointments[f"A{rng.randint(1000, 9999)}"] = {
            "doctor": rng.choice(_DOCTORS),
            "day": _day(rng.randint(1, 30)),
            "time": rng.choice(_TIMES),
            "status": rng.choice(_STATUSES),
        }
    appointment_id = rng.choice(sorted(appointments))
    doctor = appointments[appointment_id]["doctor"] if kind == "move" else rng.choice(_DOCTORS)
    taken = {a["day"] for a in appointments.values()}
    days = rng.sample([_day(n) for n in range(1, 31) if _day(n) not in taken], rng.randint(2, 3))
    slot_ids = rng.sample(range(1000, 10000), len(days))
    slots = {
        f"S{n}": {"doctor": doctor, "day": day, "time": rng.choice(_TIMES)}
        for n, day in zip(slot_ids, days, strict=True)
    }
    new_id = f"A{rng.randint(1000, 9999)}"
    while new_id in appointments:
        new_id = f"A{rng.randint(1000, 9999)}"
    return ClinicTask(
        seed=seed,
        kind=kind,
        phone=f"555-{rng.randint(1000, 9999)}",
        patient_id=f"P{rng.randint(100, 999)}",
        appointments=appointments,
        doctor=doctor,
        slots=slots,
        new_id=new_id,
        appointment_id=appointment_id if kind != "book" else None,
        day=rng.choice(days) if kind in ("book", "move") else None,
    )


# The tools ----------------------------------------------------------------------------------------
class Clinic:
    """The tools' logic over one task's database (untraced: the oracle and the verifier use it;
    the agent uses `ClinicTools`)."""

    def __init__(self, task: ClinicTask) -> None:
        self.task = task
        self.db = task.database()
        self.patient: str | None = None
        self.looked_up: set[str] = set()
        self.listed: set[str] = set()  # slot ids list_slots has shown
        self.calls: list[tuple[str, dict[str, Any], bool]] = []  # (name, arguments, ok)
        self.refused: list[str] = []  # "name: why" of every refused change

    def _need_patient(self) -> None:
        if self.patient is None:
            raise ClinicError("find the patient with find_patient first")

    def _appointment(self, appointment_id: str, *, looked_up: bool) -> dict[str, str]:
        self._need_patient()
        appointment = self.db["appointments"].get(appointment_id)
        if appointment is None:
            raise ClinicError(f"appointment {appointment_id} not found")
        if looked_up and appointment_id not in self.looked_up:
            raise ClinicError(f"look appointment {appointment_id} up with get_appointment first")
        return appointment

    def _slot(self, slot_id: str) -> dict[str, str]:
        slot = self.db["slots"].get(slot_id)
        if slot is None:
            raise ClinicError(f"slot {slot_id} is not a free slot")
        if slot_id not in self.listed:
            raise ClinicError(f"list the doctor's slots with list_slots before using {slot_id}")
        return slot

    def _booked(self, appointment_id: str, appointment: dict[str, str], verb: str) -> None:
        if appointment["status"] != "booked":
            raise ClinicError(
                f"appointment {appointment_id} is {appointment['status']}; "
                f"only booked appointments can be {verb}"
            )

    def find_patient(self, phone: str) -> dict[str, Any]:
        for patient_id, patient in self.db["patients"].items():
            if patient["phone"] == phone:
                self.patient = patient_id
                return {"patient_id": patient_id, "appointments": sorted(self.db["appointments"])}
        raise ClinicError(f"no patient with phone {phone}")

    def get_appointment(self, appointment_id: str) -> dict[str, str]:
        appointment = self._appointment(appointment_id, looked_up=False)
        self.looked_up.add(appointment_id)
        return {"appointment_id": appointment_id, **appointment}

    def list_slots(self, doctor: str) -> dict[str, Any]:
        self._need_patient()
        free = {s: slot for s, slot in sorted(self.db["slots"].items()) if slot["doctor"] == doctor}
        if not free:
            raise ClinicError(f"{doctor} has no free slots")
        self.listed.update(free)
        return {
            "doctor": doctor,
            "slots": [{"slot_id": s, "day": v["day"], "time": v["time"]} for s, v in free.items()],
        }

    def book_slot(self, patient_id: str, slot_id: str) -> dict[str, str]:
        self._need_patient()
        if patient_id != self.patient:
            raise ClinicError(f"patient {patient_id} is not the patient you found")
        slot = self._slot(slot_id)
        del self.db["slots"][slot_id]
        booking = {**slot, "status": "booked"}
        self.db["appointments"][self.task.new_id] = booking
        return {"appointment_id": self.task.new_id, "day": slot["day"], "time": slot["time"]}

    def cancel_appointment(self, appointment_id: str) -> dict[str, str]:
        appointment = self._appointment(appointment_id, looked_up=True)
        self._booked(appointment_id, appointment, "cancelled")
        appointment["status"] = "cancelled"
        return {"appointment_id": appointment_id, "status": "cancelled"}

    def reschedule(self, appointment_id: str, slot_id: str) -> dict[str, str]:
        appointment = self._appointment(appointment_id, looked_up=True)
        self._booked(appointment_id, appointment, "moved")
        slot = self._slot(slot_id)
        if slot["doctor"] != appointment["doctor"]:
            raise ClinicError(
                f"slot {slot_id} is {slot['doctor']}'s, not {appointment['doctor']}'s"
            )
        del self.db["slots"][slot_id]
        appointment.update(day=slot["day"], time=slot["time"])
        return {"appointment_id": appointment_id, "day": slot["day"], "time": slot["time"]}

    def call(self, name: Any, arguments: Any) -> str:
        """Run a parsed call and return what the agent sees; never raises."""
        tool = getattr(self, name, None) if name in TOOL_NAMES else None
        ok = False
        try:
            if tool is None:
                raise ClinicError(f"unknown tool {name!r}")
            if not isinstance(arguments, dict):
                raise ClinicError("arguments must be a JSON object")
            result = tool(**{k: str(v) for k, v in arguments.items()})
            ok = True
            return json.dumps(result)
        except TypeError as exc:
            return f"Error: bad arguments for {name}: {exc}"
        except ClinicError as exc:
            if name in WRITES:
                self.refused.append(f"{name}: {exc}")
            return f"Error: {exc}"
        finally:
            self.calls.append((str(name), arguments if isinstance(arguments, dict) else {}, ok))


class ClinicTools(Clinic):
    """The agent's tools: each call is an `execute_tool` span (arguments, result, error)."""

    @tg.tool
    def find_patient(self, phone: str) -> dict[str, Any]:
        return super().find_patient(phone)

    @tg.tool
    def get_appointment(self, appointment_id: str) -> dict[str, str]:
        return super().get_appointment(appointment_id)

    @tg.tool
    def list_slots(self, doctor: str) -> dict[str, Any]:
        return super().list_slots(doctor)

    @tg.tool
    def book_slot(self, patient_id: str, slot_id: str) -> dict[str, str]:
        return super().book_slot(patient_id, slot_id)

    @tg.tool
    def cancel_appointment(self, appointment_id: str) -> dict[str, str]:
        return super().cancel_appointment(appointment_id)

    @tg.tool
    def reschedule(self, appointment_id: str, slot_id: str) -> dict[str, str]:
        return super().reschedule(appointment_id, slot_id)


# The oracle and the verifier ---------------------------------------------------------------------
def _is_booked(task: ClinicTask) -> bool:
    return task.appointments[task.appointment_id or ""]["status"] == "booked"


def oracle_actions(task: ClinicTask) -> list[tuple[str, dict[str, str]]]:
    """The calls a perfect agent makes, in order."""
    calls = [("find_patient", {"phone": task.phone})]
    if task.kind == "book":
        slot = task.slot_id or ""
        return [
            *calls,
            ("list_slots", {"doctor": task.doctor}),
            ("book_slot", {"patient_id": task.patient_id, "slot_id": slot}),
        ]
    assert task.appointment_id is not None
    calls.append(("get_appointment", {"appointment_id": task.appointment_id}))
    if task.kind == "cancel" and _is_booked(task):
        calls.append(("cancel_appointment", {"appointment_id": task.appointment_id}))
    if task.kind == "move" and _is_booked(task):
        calls.append(("list_slots", {"doctor": task.doctor}))
        calls.append(
            ("reschedule", {"appointment_id": task.appointment_id, "slot_id": task.slot_id or ""})
        )
    return calls


def oracle_answer(task: ClinicTask) -> str:
    if task.kind == "book":
        time = task.slots[task.slot_id or ""]["time"]
        return f"Done: you are booked with {task.doctor} on {task.day} at {time}."
    appointment = task.appointments[task.appointment_id or ""]
    if task.kind == "when":
        day, time = appointment["day"], appointment["time"]
        return f"Your appointment {task.appointment_id} is on {day} at {time}."
    if not _is_booked(task):
        verb = "cancelled" if task.kind == "cancel" else "moved"
        return (
            f"Sorry, appointment {task.appointment_id} is {appointment['status']}, "
            f"so it cannot be {verb}."
        )
    if task.kind == "cancel":
        return f"Done: appointment {task.appointment_id} is cancelled."
    time = task.slots[task.slot_id or ""]["time"]
    return f"Done: appointment {task.appointment_id} is moved to {task.day} at {time}."


def expected_database(task: ClinicTask) -> dict[str, Any]:
    clinic = Clinic(task)
    for name, arguments in oracle_actions(task):
        clinic.call(name, arguments)
    return clinic.db


_READS = ("get_appointment", "list_slots")
CHECKS = 4


def _says(answer: str, text: str) -> bool:
    """`text` stands in `answer` as whole words ("June 1" is not said by "June 12")."""
    return re.search(rf"(?<![\w:]){re.escape(text.lower())}(?![\w:])", answer.lower()) is not None


def verify(task: ClinicTask, tools: Clinic, answer: str) -> Verdict:
    """Final database, the look-ups the request needs, the answer, and no refused change; the
    reward is the share of the four checks met."""
    reasons = []
    if tools.db != expected_database(task):
        reasons.append("the final database is not the expected one")
    ok_calls = [(n, a) for n, a, ok in tools.calls if ok]
    missing = [(n, a) for n, a in oracle_actions(task) if n in _READS and (n, a) not in ok_calls]
    if missing:
        name, arguments = missing[0]
        reasons.append(f"{name}({', '.join(arguments.values())}) was never called")
    names_day = task.kind == "book" or (task.kind == "move" and _is_booked(task))
    if not answer.strip():
        reasons.append("no answer")
    elif task.kind == "when":
        appointment = task.appointments[task.appointment_id or ""]
        if not (_says(answer, appointment["day"]) and _says(answer, appointment["time"])):
            reasons.append(f"the answer does not give {appointment['day']} {appointment['time']}")
    elif names_day and not _says(answer, task.day or ""):
        reasons.append(f"the answer does not give the day ({task.day})")
    if tools.refused:
        reasons.append(f"a change the rules forbid was tried ({tools.refused[0]})")
    return Verdict(not reasons, round(1 - len(reasons) / CHECKS, 4), reasons)


def demonstration(task: ClinicTask) -> list[dict[str, Any]]:
    """The oracle episode as OpenAI-format messages (request, calls, tool results, answer)."""
    clinic = Clinic(task)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.request}]
    for name, arguments in oracle_actions(task):
        call = {"type": "function", "function": {"name": name, "arguments": arguments}}
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        messages.append({"role": "tool", "content": clinic.call(name, arguments)})
    messages.append({"role": "assistant", "content": oracle_answer(task)})
    return messages


__all__ = [
    "CHECKS",
    "DEMO_SEEDS",
    "DEV_SEEDS",
    "HELDOUT_SEEDS",
    "KINDS",
    "RULES",
    "TOOL_SCHEMAS",
    "WRITES",
    "Clinic",
    "ClinicError",
    "ClinicTask",
    "ClinicTools",
    "demonstration",
    "expected_database",
    "make_task",
    "oracle_actions",
    "oracle_answer",
    "verify",
]
