"""The seed's commit-reveal: the commitment published at the start, the check of the reveal.

The commitment is the SHA-256 (lowercase hex) of the ASCII string

    opsarena-seed-v1:{match_id}:{nonce_hex}:{seed_hex}

where `nonce_hex` is 32 lowercase hex digits (16 random bytes drawn for this match) and
`seed_hex` the seed in lowercase hex. The nonce keeps a short or reused seed (`--seed`
replays) from being found by trying seeds against the commitment; the match id keeps one
match's commitment from being replayed as another's. `match_created` carries the
commitment; `match_closed` reveals `seed` and `seed_nonce`. Check one by hand with

    printf '%s' "opsarena-seed-v1:$MATCH:$NONCE:$SEED" | sha256sum
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

NONCE_BYTES = 16
HEX_RE = re.compile(r"^[0-9a-f]+$")


def new_nonce() -> bytes:
    """A fresh commitment nonce."""
    return secrets.token_bytes(NONCE_BYTES)


def seed_commitment(match_id: str, nonce: bytes, seed: bytes) -> str:
    """The commitment to `seed` for `match_id` (see the module docstring)."""
    preimage = f"opsarena-seed-v1:{match_id}:{nonce.hex()}:{seed.hex()}"
    return hashlib.sha256(preimage.encode("ascii")).hexdigest()


def reveal_problem(match_id: str, commitment: str, seed_hex: str, nonce_hex: str) -> str | None:
    """Why a revealed seed does not open `commitment`, or `None` when it does."""
    if not seed_hex or not HEX_RE.match(seed_hex) or len(seed_hex) % 2:
        return f"the revealed seed {seed_hex!r} is not lowercase hex"
    if not HEX_RE.match(nonce_hex) or len(nonce_hex) != 2 * NONCE_BYTES:
        return f"the revealed nonce {nonce_hex!r} is not {NONCE_BYTES} bytes of lowercase hex"
    computed = seed_commitment(match_id, bytes.fromhex(nonce_hex), bytes.fromhex(seed_hex))
    if not hmac.compare_digest(computed, commitment):
        return f"the revealed seed does not match the commitment {commitment}"
    return None
