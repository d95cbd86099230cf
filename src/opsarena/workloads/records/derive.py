"""Record ids and values for write checks, derived by HMAC from the match seed.

The same (seed, territory, milestone, attempt) always gives the same record, so a match
can be replayed and its evidence audited; without the seed nobody can predict one.
"""

from __future__ import annotations

import hashlib
import hmac
import json

ID_HEX = 16
VALUE_HEX = 32


def derive_record(seed: bytes, territory: str, milestone: str, attempt: int) -> tuple[str, str]:
    """Return (`record-<16 hex>`, `opaque-<32 hex>`) for one attempt.

    HMAC-SHA256 keyed by `seed` over the JSON array `["opsarena-record", territory,
    milestone, attempt]` (unambiguous for any names); the id takes the first 8 bytes of
    the digest, the value the next 16. Raises `ValueError` for an empty seed or a
    negative attempt.
    """
    if not seed:
        raise ValueError("the match seed must not be empty")
    if attempt < 0:
        raise ValueError(f"attempt {attempt} is negative")
    message = json.dumps(["opsarena-record", territory, milestone, attempt]).encode()
    digest = hmac.new(seed, message, hashlib.sha256).digest()
    return f"record-{digest[: ID_HEX // 2].hex()}", f"opaque-{digest[8 : 8 + VALUE_HEX // 2].hex()}"
