"""What goes into span attributes: content capture off, secret redaction, truncation, and
hostile values (including a hypothesis property test)."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
import time
from collections.abc import Mapping
from unittest import mock

import pytest
import tracegym as tg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tracegym.tracer import semconv as sc
from tracegym.tracer.redact import REDACTED, Redactor
from tracegym.tracer.serialize import TRUNCATION_MARKER, content_hash, to_json

pytestmark = pytest.mark.timeout(120)

MARKER_RE = re.compile(r"…\[truncated (\d+) chars\]$")


def a(span) -> dict:
    return dict(span.attributes or {})


def all_strings(spans) -> list[str]:
    """Every string an exporter would see: attribute values, event attributes, status."""
    out = []
    for span in spans:
        for attributes in [span.attributes, *(e.attributes for e in span.events)]:
            for value in (attributes or {}).values():
                if isinstance(value, str):
                    out.append(value)
                elif isinstance(value, (tuple, list)):
                    out.extend(v for v in value if isinstance(v, str))
        if span.status.description:
            out.append(span.status.description)
    return out


def strict_json(text: str):
    def no_constants(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=no_constants)


# Content capture off ------------------------------------------------------------------------

SECRET_CONTENT = "customer-ssn-078-05-1120"


@tg.tool
def lookup(query):
    return {"answer": SECRET_CONTENT}


@tg.llm(model="m", capture_messages=True)
def chat(messages):
    return {"content": SECRET_CONTENT, "usage": {"input_tokens": 4, "output_tokens": 2}}


@tg.memory_write(store="s")
def put(key, value):
    return None


@tg.memory_read(store="s")
def get(key):
    return SECRET_CONTENT


@tg.step
def think(thought):
    return SECRET_CONTENT


@tg.agent(name="private")
def private(task):
    lookup(SECRET_CONTENT)
    chat([{"role": "user", "content": SECRET_CONTENT}])
    put("k1", SECRET_CONTENT)
    get("k1")
    think(SECRET_CONTENT)
    with tg.tool("cm", arguments={"q": SECRET_CONTENT}) as call:
        call.set_result(SECRET_CONTENT)
    return SECRET_CONTENT


def test_content_capture_off():
    with tg.testing.capture(capture_content=False) as cap:
        assert private(SECRET_CONTENT) == SECRET_CONTENT
    assert len(cap.spans) == 7
    for span in cap.spans:
        assert not (sc.CONTENT_ATTRIBUTES & set(a(span))), span.name
    assert not any(SECRET_CONTENT in s for s in all_strings(cap.spans))
    # structure, names, ids, usage and provenance hashes stay
    write = a(cap.one("update_memory s"))
    read = a(cap.one("search_memory s"))
    assert write[sc.MEMORY_RECORD] == "k1"
    assert write[sc.MEMORY_CONTENT_HASH] == content_hash(SECRET_CONTENT)
    assert read[sc.MEMORY_RESULT_HASHES] == (write[sc.MEMORY_CONTENT_HASH],)
    assert read[sc.MEMORY_RESULT_IDS] == ("k1",)
    assert a(cap.one("chat m"))[sc.INPUT_TOKENS] == 4
    assert a(cap.one("execute_tool lookup"))[sc.TOOL_NAME] == "lookup"
    assert a(cap.one("execute_tool lookup"))[sc.TOOL_CALL_ID]


def test_content_capture_on_records_the_same_calls():
    """The control for the test above: with capture on, the content is there."""
    with tg.testing.capture() as cap:
        private(SECRET_CONTENT)
    tool = a(cap.one("execute_tool lookup"))
    assert json.loads(tool[sc.TOOL_ARGUMENTS]) == {"query": SECRET_CONTENT}
    assert SECRET_CONTENT in tool[sc.TOOL_RESULT]
    assert a(cap.one("update_memory s"))[sc.MEMORY_CONTENT] == SECRET_CONTENT
    assert a(cap.one("search_memory s"))[sc.MEMORY_QUERY] == "k1"
    assert SECRET_CONTENT in a(cap.one("chat m"))[sc.INPUT_MESSAGES]
    assert a(cap.one("invoke_agent private"))[sc.OUTPUT] == SECRET_CONTENT


def test_content_capture_per_operation(cap):
    @tg.tool(capture=False)
    def quiet(x):
        return x

    @tg.tool
    def loud(x):
        return x

    quiet("hidden")
    loud("shown")
    assert sc.TOOL_ARGUMENTS not in a(cap.one("execute_tool quiet"))
    assert sc.TOOL_RESULT not in a(cap.one("execute_tool quiet"))
    assert a(cap.one("execute_tool loud"))[sc.TOOL_RESULT] == "shown"


def test_per_operation_capture_overrides_global_off():
    @tg.tool(capture=True)
    def audited(x):
        return x

    with tg.testing.capture(capture_content=False) as cap:
        audited("kept")
    assert a(cap.one("execute_tool audited"))[sc.TOOL_RESULT] == "kept"


def test_content_capture_off_from_environment(monkeypatch):
    monkeypatch.setenv("TRACEGYM_CAPTURE_CONTENT", "false")
    with tg.testing.capture() as cap:
        lookup("from env")
    assert sc.TOOL_ARGUMENTS not in a(cap.one("execute_tool lookup"))


# Redaction ----------------------------------------------------------------------------------

OPENAI_KEY = "sk-proj-Ab3dEfGhIjKlMnOpQrStUvWx1234567890"
ANTHROPIC_KEY = "sk-ant-api03-abcdefghijklmnopqrstuvwxyz012345"
BEARER = "eyJhbGciOi.abcDEF123456-ghiJKL_789"
PASSWORD = "hunter2hunter2"
GITHUB_TOKEN = "ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"


@pytest.mark.parametrize(
    ("value", "secret"),
    [
        (f"use key {OPENAI_KEY} for the call", OPENAI_KEY),
        ({"client": {"api_key_value": ANTHROPIC_KEY}}, ANTHROPIC_KEY),
        ({"headers": {"Authorization": f"Bearer {BEARER}"}}, BEARER),
        (f"curl -H 'authorization: bearer {BEARER}'", BEARER),
        (f"https://example.com/login?user=bob&password={PASSWORD}&next=/", PASSWORD),
        (f"PASSWORD={PASSWORD}", PASSWORD),
        ({"user": "bob", "password": PASSWORD}, PASSWORD),
        ({"Password": PASSWORD, "note": "ok"}, PASSWORD),
        ({"config": [{"secret": PASSWORD}]}, PASSWORD),
        (f"postgres://admin:{PASSWORD}@db.internal:5432/app", PASSWORD),
        (
            "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
            "ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
        ),
    ],
)
def test_secrets_are_redacted_in_arguments_and_results(cap, value, secret):
    @tg.tool
    def call_api(payload):
        return payload

    assert call_api(value) is value  # the function sees the real value
    span = cap.one("execute_tool call_api")
    strings = all_strings([span])
    assert not any(secret in s for s in strings), strings
    assert REDACTED in a(span)[sc.TOOL_ARGUMENTS]
    assert REDACTED in a(span)[sc.TOOL_RESULT]
    assert tg.stats().spans_redacted == 1


def test_json_text_result_is_redacted(cap):
    @tg.tool
    def read_config():
        return '{"db": {"password": "' + PASSWORD + '"}}'

    read_config()
    result = a(cap.one("execute_tool read_config"))[sc.TOOL_RESULT]
    assert PASSWORD not in result
    assert json.loads(result) == {"db": {"password": REDACTED}}


def test_json_text_argument_is_redacted(cap):
    @tg.tool
    def call_api(payload):
        return None

    call_api('{"db": {"password": "' + PASSWORD + '"}}')
    args = a(cap.one("execute_tool call_api"))[sc.TOOL_ARGUMENTS]
    assert PASSWORD not in args


def test_redaction_keeps_the_rest_readable(cap):
    @tg.tool
    def login(user, password):
        return "ok"

    login("bob", PASSWORD)
    args = json.loads(a(cap.one("execute_tool login"))[sc.TOOL_ARGUMENTS])
    assert args == {"user": "bob", "password": REDACTED}


def test_clean_text_is_not_redacted(cap):
    @tg.tool
    def explain(text):
        return text

    texts = [
        "the password policy requires 12 characters",
        "token usage was 1200 input tokens",
        "ask the user for their secret handshake preferences",
        "see https://docs.example.com/api/keys for details",
    ]
    for text in texts:
        explain(text)
    results = [a(s)[sc.TOOL_RESULT] for s in cap.spans]
    assert results == texts
    assert tg.stats().spans_redacted == 0


def test_secrets_in_exception_events_are_redacted(cap):
    @tg.tool
    def connect():
        raise ConnectionError(f"auth failed for api_key={OPENAI_KEY} password={PASSWORD}")

    with pytest.raises(ConnectionError) as info:
        connect()
    assert OPENAI_KEY in str(info.value)  # the user's exception itself is untouched
    span = cap.one("execute_tool connect")
    (event,) = span.events
    for key in ("exception.message", "exception.stacktrace"):
        text = event.attributes[key]
        assert OPENAI_KEY not in text
        assert PASSWORD not in text
        assert REDACTED in text


def test_secrets_in_error_status_are_redacted(cap):
    @tg.tool
    def connect():
        raise ConnectionError(f"bad key {OPENAI_KEY}")

    with pytest.raises(ConnectionError):
        connect()
    span = cap.one("execute_tool connect")
    assert OPENAI_KEY not in span.status.description


def test_passphrase_with_spaces_is_fully_redacted(cap):
    @tg.tool
    def login(credentials):
        return "ok"

    login({"user": "bob", "password": "correct horse battery staple"})
    args = a(cap.one("execute_tool login"))[sc.TOOL_ARGUMENTS]
    assert "battery staple" not in args


def test_secret_named_attributes_are_redacted(cap):
    with tg.tool("custom") as call:
        call.set_attribute("db.password", "plain")
        call.set_attribute("http.request.header.authorization", ("Bearer abcdefghijkl",))
        call.set_attribute("app.note", f"key={OPENAI_KEY}")
        call.set_attribute("app.list", ("fine", f"token {OPENAI_KEY}"))
        call.set_attribute("app.count", 3)
    span = a(cap.one("execute_tool custom"))
    assert span["db.password"] == REDACTED
    assert span["http.request.header.authorization"] == REDACTED
    assert OPENAI_KEY not in span["app.note"]
    assert span["app.list"][0] == "fine"
    assert OPENAI_KEY not in span["app.list"][1]
    assert span["app.count"] == 3


def test_memory_content_redacted_but_hash_of_the_real_content(cap):
    content = f"note: api_key={OPENAI_KEY}"
    put("k", content)
    write = a(cap.one("update_memory s"))
    assert OPENAI_KEY not in write[sc.MEMORY_CONTENT]
    assert write[sc.MEMORY_CONTENT_HASH] == content_hash(content)


def test_redaction_can_be_switched_off():
    with tg.testing.capture(redact=False) as cap:
        lookup(OPENAI_KEY)
    assert OPENAI_KEY in a(cap.one("execute_tool lookup"))[sc.TOOL_ARGUMENTS]


def test_extra_redaction_patterns_add_to_the_builtin_ones():
    redactor = Redactor([r"ACME-\d{6}"])
    text = f"order ACME-123456 paid with {OPENAI_KEY}"
    out = redactor.redact(text)
    assert "ACME-123456" not in out
    assert OPENAI_KEY not in out
    assert out.count(REDACTED) == 2
    assert Redactor().redact("order ACME-123456") == "order ACME-123456"


# Truncation ---------------------------------------------------------------------------------


def test_truncation_marker_with_configured_length():
    @tg.tool
    def echo(text):
        return text

    with tg.testing.capture(max_value_length=100) as cap:
        echo("x" * 1000)
    span = a(cap.one("execute_tool echo"))
    assert span[sc.TOOL_RESULT] == "x" * 100 + TRUNCATION_MARKER.format(900)
    assert span[sc.TOOL_RESULT].endswith("…[truncated 900 chars]")
    args = span[sc.TOOL_ARGUMENTS]
    match = MARKER_RE.search(args)
    assert match is not None
    assert len(args) == 100 + len(match.group(0))
    assert args.startswith('{"text":"xxxx')


def test_default_truncation_length(cap):
    @tg.tool
    def echo(text):
        return text

    echo("y" * 10_000)
    result = a(cap.one("execute_tool echo"))[sc.TOOL_RESULT]
    assert result == "y" * 8192 + "…[truncated 1808 chars]"


def test_truncation_length_from_environment(monkeypatch):
    monkeypatch.setenv("TRACEGYM_MAX_VALUE_LENGTH", "200")

    @tg.tool
    def echo(text):
        return text

    with tg.testing.capture() as cap:
        echo("z" * 300)
    assert a(cap.one("execute_tool echo"))[sc.TOOL_RESULT] == "z" * 200 + TRUNCATION_MARKER.format(
        100
    )


def test_truncated_memory_content_keeps_the_full_hash():
    content = "long memory " * 1000

    with tg.testing.capture(max_value_length=64) as cap:
        put("big", content)
        get("big")  # returns SECRET_CONTENT: a different record
    write = a(cap.one("update_memory s"))
    assert MARKER_RE.search(write[sc.MEMORY_CONTENT])
    assert write[sc.MEMORY_CONTENT_HASH] == content_hash(content)
    assert write[sc.MEMORY_CONTENT_HASH] != content_hash(content[:64])


def test_huge_and_wide_values_are_bounded_in_size_and_time(cap):
    @tg.tool
    def ingest(blob, rows, nested):
        return len(blob)

    deep: list = []
    node = deep
    for _ in range(200):
        node.append([])
        node = node[0]
    start = time.perf_counter()
    assert ingest("b" * 20_000_000, list(range(100_000)), deep) == 20_000_000
    elapsed = time.perf_counter() - start
    assert elapsed < 2.0
    args = a(cap.one("execute_tool ingest"))[sc.TOOL_ARGUMENTS]
    assert len(args) <= 8192 + 40
    assert "more items" in args or MARKER_RE.search(args)


def test_wide_list_is_summarised(cap):
    @tg.tool
    def many():
        return list(range(1000))

    many()
    result = strict_json(a(cap.one("execute_tool many"))[sc.TOOL_RESULT])
    assert result[:100] == list(range(100))
    assert result[100] == "…+900 more items"
    assert len(result) == 101


def test_nested_big_containers_are_walked_with_bounds(cap):
    @tg.tool
    def ingest(rows):
        return None

    ingest(list(range(1000)))
    args = strict_json(a(cap.one("execute_tool ingest"))[sc.TOOL_ARGUMENTS])
    assert args["rows"][100] == "…+900 more items"
    start = time.perf_counter()
    ingest(list(range(1_000_000)))
    assert time.perf_counter() - start < 0.2


# Hostile values -----------------------------------------------------------------------------


class BadRepr:
    def __repr__(self):
        raise RuntimeError("no repr for you")

    __str__ = __repr__


class ReprNotStr:
    def __repr__(self):
        return 42  # type: ignore[return-value]


class BadEverything:
    def __getattribute__(self, name):
        raise RuntimeError(f"no attribute {name}")


class BadEq:
    def __eq__(self, other):
        raise RuntimeError("no eq")

    def __hash__(self):
        return 7


class BadClass:
    @property
    def __class__(self):  # type: ignore[override]
        raise RuntimeError("no class")


class BadMapping(Mapping):
    def __getitem__(self, key):
        raise RuntimeError("no item")

    def __iter__(self):
        raise RuntimeError("no iter")

    def __len__(self):
        raise RuntimeError("no len")


class BadList(list):
    def __iter__(self):
        raise RuntimeError("no iter")

    def __len__(self):
        raise RuntimeError("no len")


class BadStrSub(str):
    def __str__(self):
        raise RuntimeError("no str")


class BadDump:
    def model_dump(self):
        raise RuntimeError("no dump")


@dataclasses.dataclass
class BadField:
    x: int

    @property
    def y(self):
        raise RuntimeError("no y")


class Color(str, enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


def weird_objects():
    return [
        BadRepr(),
        ReprNotStr(),
        BadEverything(),
        BadEq(),
        BadClass(),
        BadMapping(),
        BadList([1, 2]),
        BadStrSub("sub"),
        BadDump(),
        BadField(1),
        Color.RED,
        Level.HIGH,
        mock.Mock(),
        mock.MagicMock(),
        object(),
        type,
        print,
        iter([1, 2, 3]),
        (i for i in range(3)),
        memoryview(b"view"),
        bytearray(b"\x00\xff"),
        float("nan"),
        float("-inf"),
        10**400,
        1e308 * 10,
        complex(1, 2),
        Ellipsis,
        NotImplemented,
    ]


def test_hostile_values_never_raise_and_are_returned_unchanged(cap):
    @tg.tool
    def echo(value, *rest, **kw):
        return value

    @tg.agent(name="hostile")
    def agent(value):
        return value

    for value in weird_objects():
        assert echo(value, value, k=value) is value
        assert agent(value) is value
    assert tg.stats().internal_errors == 0
    assert len(cap.spans) == 2 * len(weird_objects())
    for span in cap.by_operation("execute_tool"):
        assert isinstance(a(span)[sc.TOOL_ARGUMENTS], str)
        assert isinstance(a(span)[sc.TOOL_RESULT], str)


def test_serialised_values_are_strict_json(cap):
    @tg.tool
    def echo(value):
        return value

    cyclic_list: list = [1]
    cyclic_list.append(cyclic_list)
    cyclic_dict: dict = {"name": "d"}
    cyclic_dict["self"] = cyclic_dict
    values = {
        "nan": float("nan"),
        "inf": float("inf"),
        "bytes": b"\x00\xffhello",
        "cycle": cyclic_list,
        "dcycle": cyclic_dict,
        "bad": BadRepr(),
        "keys": {1: "int key", (1, 2): "tuple key", None: "none key", BadRepr(): "bad key"},
        "set": {3, 1, 2},
        "dataclass": BadField(5),
        "enum": Color.RED,
        "intenum": Level.HIGH,
    }
    echo(values)
    parsed = strict_json(a(cap.one("execute_tool echo"))[sc.TOOL_ARGUMENTS])["value"]
    assert parsed["nan"] == "nan"
    assert parsed["inf"] == "inf"
    assert parsed["bytes"].endswith("hello")
    assert parsed["cycle"] == [1, "<cycle>"]
    assert parsed["dcycle"] == {"name": "d", "self": "<cycle>"}
    assert parsed["bad"] == "<BadRepr>"
    assert set(parsed["keys"].values()) == {"int key", "tuple key", "none key", "bad key"}
    assert sorted(parsed["set"]) == [1, 2, 3]
    assert parsed["dataclass"] == {"x": 5}
    assert parsed["enum"] == "red"
    assert parsed["intenum"] == 3


def test_arguments_are_not_consumed_or_mutated(cap):
    @tg.tool
    def consume(items, config):
        return list(items), config

    config = {"nested": {"list": [1, 2]}, "s": {1}}
    snapshot = json.dumps(config, default=sorted)
    items, seen_config = consume(iter([1, 2, 3]), config)
    assert items == [1, 2, 3]  # the iterator reached the function whole
    assert seen_config is config
    assert json.dumps(config, default=sorted) == snapshot


def test_hostile_memory_record_id_still_traced(cap):
    assert put(BadRepr(), "value") is None
    write = a(cap.one("update_memory s"))
    assert write[sc.MEMORY_CONTENT_HASH] == content_hash("value")


# Property-based: any value --------------------------------------------------------------------

WEIRD = weird_objects()
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**30, max_value=10**60),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=50),
    st.text(st.characters(categories=["Cs"]), max_size=5),  # lone surrogates
    st.binary(max_size=50),
    st.complex_numbers(allow_nan=True, allow_infinity=True),
    # by index: hypothesis must not repr these objects while building the strategy
    st.integers(0, len(weird_objects()) - 1).map(lambda i: WEIRD[i]),
)
keys = st.one_of(st.text(max_size=10), st.integers(), st.none(), st.tuples(st.integers()))
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.tuples(children, children),
        st.dictionaries(keys, children, max_size=6),
        st.frozensets(st.one_of(st.integers(), st.text(max_size=5)), max_size=4),
        st.builds(lambda xs: BadList(xs), st.lists(children, max_size=3)),
    ),
    max_leaves=20,
)


@tg.tool
def prop_tool(value, *args, **kwargs):
    return value


@tg.agent(name="prop")
def prop_agent(value):
    return prop_tool(value, value, key=value)


@tg.llm(model="prop", capture_messages=True)
def prop_llm(messages):
    return messages


@tg.memory_write(store="prop")
def prop_write(key, value):
    return value


@tg.memory_read(store="prop")
def prop_read(key):
    return key


@tg.step
def prop_step(value):
    yield value
    return value


@given(value=values)
@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
def test_any_value_never_raises_through_a_decorated_function(value):
    with tg.testing.capture(max_value_length=256) as cap:
        assert prop_agent(value) is value
        assert prop_llm(value) is value
        assert prop_write(value, value) is value
        assert prop_write("fixed-key", value) is value
        assert prop_read(value) is value
        gen = prop_step(value)
        assert next(gen) is value
        with pytest.raises(StopIteration) as stop:
            next(gen)
        assert stop.value.value is value
        with tg.tool("cm", arguments={"v": value}) as call:
            call.set_result(value)
    tool = a(cap.one("execute_tool prop_tool"))
    for key in (sc.TOOL_ARGUMENTS, sc.TOOL_RESULT):
        assert isinstance(tool[key], str)
        assert len(tool[key]) <= 256 + len(TRUNCATION_MARKER.format(10**12))
    assert cap.one("invoke_agent prop").end_time is not None
    assert a(cap.one("chat prop"))[sc.OPERATION] == "chat"


@given(value=values, max_length=st.integers(min_value=1, max_value=500))
@settings(max_examples=150, deadline=None)
def test_to_json_and_content_hash_never_raise(value, max_length):
    text = to_json(value, max_length)
    assert isinstance(text, str)
    assert len(text) <= max_length + len(TRUNCATION_MARKER.format(10**12))
    digest = content_hash(value)
    assert re.fullmatch(r"[0-9a-f]{32}", digest)
    assert content_hash(value) == digest  # stable


@given(st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=8), min_size=1))
@settings(max_examples=100, deadline=None)
def test_content_hash_ignores_key_order(mapping):
    reordered = dict(reversed(list(mapping.items())))
    assert content_hash(mapping) == content_hash(reordered)


def test_content_hash_distinguishes_values():
    assert content_hash("a") != content_hash("b")
    assert content_hash({"a": 1}) != content_hash({"a": 2})
    assert content_hash([1, 2]) != content_hash([2, 1])
    assert not math.isnan(len(content_hash(float("nan"))))
