"""The ``auth`` settings section: open or keyed access, and how long verified keys are trusted. Composed into
:class:`proxy.assembly.config.Settings`; its defaults are defined here once."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from proxy.core.settings_section import Section


class AuthSettings(Section):
    mode: Literal["open", "keys"] = Field(
        default="open", description="open: one anonymous tenant; keys: Authorization: Bearer <API key> required"
    )
    key_cache_ttl_s: float = Field(default=30.0, ge=0, description="How long a verified key is trusted without lookup")
    key_sync_s: float = Field(default=1.0, gt=0, description="How often each replica reads the key store's changes "
                              "(revocations) and applies them to the keys it remembers: a revoked key stops working "
                              "everywhere within this time, and stays refused through a later outage of the store")
    outage_key_trust_s: float = Field(default=300.0, ge=0, description="While the key store cannot answer, how long "
                                      "after its last confirmation (a lookup, or a read of the changes) a remembered "
                                      "key keeps working; past it, 503 (0: at once)")
