"""Challenges: the file format, the built-in challenges, and the check registry."""

from opsarena.challenges.catalog import (
    builtin_challenge,
    builtin_names,
    find_challenge,
    load_challenge,
    parse_challenge,
)
from opsarena.challenges.checks import (
    REFEREE_ERROR,
    VERIFICATION_FAILED,
    Check,
    CheckContext,
    FaultKind,
    Verdict,
    check_names,
    get_check,
    register_check,
    unknown_checks,
)
from opsarena.challenges.model import Challenge, Milestone

__all__ = [
    "REFEREE_ERROR",
    "VERIFICATION_FAILED",
    "Challenge",
    "Check",
    "CheckContext",
    "FaultKind",
    "Milestone",
    "Verdict",
    "builtin_challenge",
    "builtin_names",
    "check_names",
    "find_challenge",
    "get_check",
    "load_challenge",
    "parse_challenge",
    "register_check",
    "unknown_checks",
]
