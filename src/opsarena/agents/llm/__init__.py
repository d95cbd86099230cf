"""The `llm:MODEL` agent: a tool-calling loop over any OpenAI-compatible chat-completions API.

The system prompt carries the brief; the model acts on its host through four tools
(`bash`, `read_file`, `write_file`, `done`). Between turns the referee's feedback arrives
as user messages starting "Referee:". Each response's usage is reported at once
(`report("usage", ...)`), and every message (with its reasoning), tool call and tool
result is reported as a bounded transcript entry, so `replay_messages` can rebuild the
conversation. The parts: `agent` (the loop and how a run ends), `wire` (what a provider's
answers mean), `context` (staying inside the window), `tools`, `endpoint` (key checks,
model list, generation records, prices).
"""

from opsarena.agents.llm.agent import (
    LlmAgent,
    Spent,
    assistant_message,
    bounded,
    limit_reached,
    normalise_calls,
    replay_messages,
    request_fields,
)
from opsarena.agents.llm.context import fit, head_tail
from opsarena.agents.llm.endpoint import Endpoint, builtin_prices, resolve_endpoint
from opsarena.agents.llm.tools import ToolCallError, format_exec_result, parse_tool_arguments
from opsarena.agents.llm.wire import (
    Completion,
    Problem,
    RetryPolicy,
    Usage,
    is_retryable,
    parse_retry_after,
    priced_cost_microusd,
    read_completion,
    retry_delay,
    usage_of,
)

__all__ = [
    "Completion",
    "Endpoint",
    "LlmAgent",
    "Problem",
    "RetryPolicy",
    "Spent",
    "ToolCallError",
    "Usage",
    "assistant_message",
    "bounded",
    "builtin_prices",
    "fit",
    "format_exec_result",
    "head_tail",
    "is_retryable",
    "limit_reached",
    "normalise_calls",
    "parse_retry_after",
    "parse_tool_arguments",
    "priced_cost_microusd",
    "read_completion",
    "replay_messages",
    "request_fields",
    "resolve_endpoint",
    "retry_delay",
    "usage_of",
]
