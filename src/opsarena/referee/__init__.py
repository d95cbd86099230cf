"""The referee: HTTP probes into hosts, the built-in checks, verdicts and the failure table."""

from opsarena.referee import checks as checks  # registers the built-in checks
from opsarena.referee.failures import REASONS, Observation, Reason, classify_error
from opsarena.referee.feedback import feedback_message
from opsarena.referee.probe import HttpResponse, ProbeError, ProbeLimits, http_request
from opsarena.referee.records import derive_record
from opsarena.referee.referee import MilestoneState, PreflightResult, Referee, enforce_table

__all__ = [
    "REASONS",
    "HttpResponse",
    "MilestoneState",
    "Observation",
    "PreflightResult",
    "ProbeError",
    "ProbeLimits",
    "Reason",
    "Referee",
    "checks",
    "classify_error",
    "derive_record",
    "enforce_table",
    "feedback_message",
    "http_request",
]
