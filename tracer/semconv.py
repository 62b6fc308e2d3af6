"""Attribute and span names: the span contract in one place.

OpenTelemetry GenAI semantic-convention names where one exists, `tracegym.*` for the rest.
Analysis, importers and the OTLP receiver read the same constants, so they cannot drift apart.
"""

from __future__ import annotations

# GenAI semantic conventions.
OPERATION = "gen_ai.operation.name"
AGENT_NAME = "gen_ai.agent.name"
AGENT_ID = "gen_ai.agent.id"
CONVERSATION_ID = "gen_ai.conversation.id"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_RESULT = "gen_ai.tool.call.result"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
PROVIDER = "gen_ai.provider.name"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
TOOL_DEFINITIONS = "gen_ai.tool.definitions"
MEMORY_STORE = "gen_ai.memory.store.id"
MEMORY_RECORD = "gen_ai.memory.record.id"
MEMORY_QUERY = "gen_ai.memory.query.text"
ERROR_TYPE = "error.type"

# Operation names (values of gen_ai.operation.name).
OP_AGENT = "invoke_agent"
OP_TOOL = "execute_tool"
OP_CHAT = "chat"
OP_MEMORY_SEARCH = "search_memory"
OP_MEMORY_UPDATE = "update_memory"
OP_MEMORY_DELETE = "delete_memory"
OP_STEP = "step"
OP_SUBTASK = "subtask"
OP_OUTCOME = "record_outcome"

# tracegym's own attributes.
RUN_ID = "tracegym.run.id"
# Who asked for a tool call, when not the agent: importers set "user" on the calls a user made on
# their own side (tau2-bench's device tools). Analysis measures the agent's behaviour without them.
TOOL_REQUESTED_BY = "tracegym.tool.requested_by"
STEP_INDEX = "tracegym.step.index"
INPUT = "tracegym.input"
OUTPUT = "tracegym.output"
STEP_NAME = "tracegym.step.name"
SUBTASK_NAME = "tracegym.subtask.name"
BUDGET_STEPS = "tracegym.budget.steps"
BUDGET_TOKENS = "tracegym.budget.tokens"
BUDGET_SECONDS = "tracegym.budget.seconds"
USED_STEPS = "tracegym.budget.steps_used"
USED_TOKENS = "tracegym.budget.tokens_used"
USED_SECONDS = "tracegym.budget.seconds_used"
BUDGET_EXCEEDED = "tracegym.budget.exceeded"
MEMORY_CONTENT = "tracegym.memory.content"
MEMORY_CONTENT_HASH = "tracegym.memory.content_hash"
MEMORY_RESULT_IDS = "tracegym.memory.result.record_ids"
MEMORY_RESULT_HASHES = "tracegym.memory.result.content_hashes"
# Records a read returned beyond the first MEMORY_RESULT_LIMIT (kinds.py), whose ids and hashes
# are left out; absent when none were.
MEMORY_RESULT_OMITTED = "tracegym.memory.result.omitted"
GENERATOR_ITEMS = "tracegym.generator.items"
OUTCOME_TARGET = "tracegym.outcome.target"
OUTCOME_SUCCESS = "tracegym.outcome.success"
OUTCOME_REWARD = "tracegym.outcome.reward"
OUTCOME_SOURCE = "tracegym.outcome.source"
OUTCOME_LABELS = "tracegym.outcome.labels"

OUTCOME_SPAN_NAME = "tracegym.outcome"
NIGHTLY_SPAN_NAME = "tracegym.nightly"  # one record per night of the batch job
NIGHTLY_PREFIX = "tracegym.nightly."
INSTRUMENTATION_SCOPE = "tracegym"

# OpenInference attributes written alongside the GenAI ones (tracer/openinference.py), so that
# Phoenix and other OpenInference readers render tracegym's spans; never stored by tracegym.
OI_SPAN_KIND = "openinference.span.kind"
OI_INPUT_VALUE = "input.value"
OI_INPUT_MIME = "input.mime_type"
OI_OUTPUT_VALUE = "output.value"
OI_OUTPUT_MIME = "output.mime_type"
OI_MODEL_NAME = "llm.model_name"
OI_PROMPT_TOKENS = "llm.token_count.prompt"
OI_COMPLETION_TOKENS = "llm.token_count.completion"
OI_TOTAL_TOKENS = "llm.token_count.total"

# Attributes that hold user content: dropped when content capture is off.
CONTENT_ATTRIBUTES = frozenset(
    {
        TOOL_ARGUMENTS,
        TOOL_RESULT,
        INPUT_MESSAGES,
        OUTPUT_MESSAGES,
        INPUT,
        OUTPUT,
        MEMORY_CONTENT,
        MEMORY_QUERY,
        OI_INPUT_VALUE,
        OI_OUTPUT_VALUE,
    }
)


def tool_requester(operation: object, attributes: object) -> str | None:
    """Who ran a tool call when it was not the agent (`TOOL_REQUESTED_BY`: "user" on
    tau2-bench's phone tools), else None: the one reading of that attribute, for analysis, `show`
    and the dashboard."""
    if operation != OP_TOOL or not isinstance(attributes, dict):
        return None
    who = attributes.get(TOOL_REQUESTED_BY)
    return None if who in (None, "", "assistant") else str(who)
