"""The long-lived components of one proxy process, built from the settings and started/stopped together."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.config import Settings
from proxy.upstream.backends import BackendPool
from proxy.upstream.client import UpstreamClient
from tiers.memory import MemoryStore
from tiers.policies import make_policy
from tiers.response_tier import ResponseTier
from tiers.versions import KnowledgeVersions


@dataclass
class Runtime:
    """Everything a pipeline stage may need, created once per process."""

    settings: Settings
    client: UpstreamClient = field(init=False)
    backends: BackendPool = field(init=False)
    l1: ResponseTier = field(init=False)
    versions: KnowledgeVersions = field(init=False)
    draining: bool = False

    def __post_init__(self) -> None:
        upstreams = self.settings.upstreams
        self.client = UpstreamClient(
            connect_timeout=upstreams.connect_timeout_s,
            read_timeout=upstreams.read_timeout_s,
            pool_size=upstreams.pool_size,
        )
        self.backends = BackendPool(list(upstreams.llm))
        l1 = self.settings.cache.l1
        self.l1 = ResponseTier("l1", MemoryStore(make_policy(l1.policy, l1.max_bytes), max_entries=l1.max_entries))
        self.versions = KnowledgeVersions()

    async def start(self) -> None:
        self.backends.start(self.client.session, self.settings.upstreams.health_interval_s)

    async def stop(self) -> None:
        await self.backends.stop()
        await self.client.close()
