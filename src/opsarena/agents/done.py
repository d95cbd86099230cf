"""Who may declare a territory done: the done token of a territory whose agent kind
has one (`agents.registry.has_done_token`), or the arena operator's key.

`opsarena done` logs a `done_requested` event carrying a proof (an HMAC of the request
keyed by the token or the key, never the secret itself); the controller checks the proof
(`proof_holds`) and only then logs `competitor_done`. The token derives from a secret
key held only by the controller's process (`done_token`); the operator key is a file
only the arena's user can read (`operator_key_path`). Kind-neutral: no agent kind here.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
from pathlib import Path

import platformdirs

DONE_TOKEN_ENV = "OPSARENA_DONE_TOKEN"
OPERATOR_KEY_ENV = "OPSARENA_OPERATOR_KEY"


def done_token(key: bytes, match_id: str, territory: str) -> str:
    """The done token of `territory` in `match_id`, derived from the match's secret `key`
    (held only by the controller's process, never logged)."""
    digest = hmac.new(key, f"opsarena-done-token:{match_id}:{territory}".encode(), "sha256")
    return base64.urlsafe_b64encode(digest.digest()[:18]).decode()


def done_proof(secret: str, match_id: str, territory: str) -> str:
    """What `opsarena done` logs to prove it holds `secret` (a done token or the operator
    key) for this request: an HMAC, from which the secret cannot be recovered, valid for
    this match and territory only."""
    message = f"opsarena-done:{match_id}:{territory}".encode()
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def proof_holds(proof: object, secret: str, match_id: str, territory: str) -> bool:
    """Whether `proof` is `done_proof(secret, match_id, territory)` (constant time)."""
    if not isinstance(proof, str):
        return False
    expected = done_proof(secret, match_id, territory)
    return hmac.compare_digest(proof.encode(), expected.encode())


def operator_key_path() -> Path:
    """`$OPSARENA_OPERATOR_KEY`, else `operator.key` in the arena user's data directory."""
    override = os.environ.get(OPERATOR_KEY_ENV)
    if override:
        return Path(override).expanduser()
    return platformdirs.user_data_path("opsarena") / "operator.key"


def operator_key(create: bool = False) -> str | None:
    """The operator key (mode 0600, only the arena's user can read it); with `create`, a
    new one is made when there is none. None when it is missing or unreadable."""
    path = operator_key_path()
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        if not create:
            return None
    except OSError:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_hex(32)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another arena made it meanwhile
        return path.read_text().strip() or None
    with os.fdopen(fd, "w") as file:
        file.write(key + "\n")
    return key


def human_instructions(match_id: str, territory: str, token: str) -> str:
    """What `opsarena run` prints for a territory played by a person (a kind with a done
    token): the exact commands to use and the token that proves the person is this
    territory's competitor."""
    return (
        f"{territory}: work in your host with `opsarena hosts shell {match_id}/{territory}`; "
        f"when finished run `{DONE_TOKEN_ENV}={token} opsarena done {match_id} {territory}` "
        "(the token is yours alone: it ends your session)"
    )
