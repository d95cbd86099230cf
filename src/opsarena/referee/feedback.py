"""Short referee messages for competitors, built from `attempt_result` event data."""

from __future__ import annotations

from typing import Any

MAX_FEEDBACK_CHARS = 2000


def feedback_message(result: dict[str, Any]) -> str:
    """One message for the competitor about one `attempt_result` (its event `data`).

    Passed: "service-up passed (+10 points)". Failed: "service-restart failed:
    record_missing — DETAIL". Referee error: says it was not the competitor's fault and
    will be retried. At most `MAX_FEEDBACK_CHARS` characters. Pure.
    """
    milestone = result.get("milestone", "?")
    attempt = result.get("attempt")
    verdict = result.get("verdict")
    if verdict == "passed":
        text = f"{milestone} passed (+{result.get('points', 0)} points, attempt {attempt})"
    elif verdict == "failed":
        text = (
            f"{milestone} failed: {result.get('failure_reason')} — {result.get('failure_detail')}"
            f" (attempt {attempt}; the referee tries again at its cadence)"
        )
    else:
        text = (
            f"{milestone}: referee error ({result.get('failure_reason')}), not your fault; "
            f"nothing was scored and the attempt will be repeated — {result.get('failure_detail')}"
        )
    if len(text) > MAX_FEEDBACK_CHARS:
        text = text[: MAX_FEEDBACK_CHARS - 3] + "..."
    return text
