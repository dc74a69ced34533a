"""The ``idempotency`` settings section: how long and how much of an idempotent call's answer is kept. Composed into
:class:`proxy.assembly.config.Settings`; its defaults are defined here once."""

from __future__ import annotations

from pydantic import Field

from proxy.core.settings_section import Section


class IdempotencySettings(Section):
    enabled: bool = Field(default=True, description="Honour Idempotency-Key on LLM calls: a repeat gets the first "
                          "answer and is charged once")
    ttl_s: float = Field(default=86_400.0, gt=0, description="How long a finished call's answer serves repeats")
    running_ttl_s: float = Field(default=600.0, gt=0, description="Longest a key stays held by an unfinished call")
    max_response_bytes: int = Field(default=4 * 1024 * 1024, ge=0, description="Larger answers are not kept (a "
                                    "repeat runs again)")
    max_bytes: int = Field(default=256 * 1024**2, ge=0, description="Bytes of kept answers held in all (process "
                           "memory, or Redis when redis.url is set): past it the oldest finished key of the user "
                           "holding the most goes")
    max_bytes_per_user: int = Field(default=16 * 1024**2, ge=0, description="Bytes of kept answers one user holds "
                                    "at most: past it the user's oldest finished key goes; an answer that cannot fit "
                                    "is not kept (a repeat runs again)")
    max_entries: int = Field(default=10_000, ge=1, description="Keys kept in memory in all (embedded mode; Redis, "
                             "when redis.url is set, bounds them per user, in bytes and by ttl_s)")
    max_entries_per_user: int = Field(default=1_000, ge=1, description="Keys one user holds at most: past it the "
                                      "user's oldest finished key goes; with only running ones, 429")
