"""Challenges: the file format's loader, the built-in challenges, and (re-exported for
challenge authors) the engine's check contract (`opsarena.referee.contract`)."""

from opsarena.challenges.catalog import (
    builtin_challenge,
    builtin_names,
    find_challenge,
    load_challenge,
    parse_challenge,
)
from opsarena.referee.contract import (
    REFEREE_ERROR,
    VERIFICATION_FAILED,
    Check,
    CheckContext,
    FaultKind,
    Setup,
    Verdict,
    check_names,
    get_check,
    register_check,
    register_setup,
    unknown_checks,
)
from opsarena.referee.model import Challenge, Milestone

__all__ = [
    "REFEREE_ERROR",
    "VERIFICATION_FAILED",
    "Challenge",
    "Check",
    "CheckContext",
    "FaultKind",
    "Milestone",
    "Setup",
    "Verdict",
    "builtin_challenge",
    "builtin_names",
    "check_names",
    "find_challenge",
    "get_check",
    "load_challenge",
    "parse_challenge",
    "register_check",
    "register_setup",
    "unknown_checks",
]
