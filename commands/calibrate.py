"""``ragproxy calibrate PAIRS.csv [--labels is_duplicate|same_answer] [--target 0.02] [--namespace NS] [--write
CONFIG.yaml] [--prior]``: fixed L2 thresholds from labelled question pairs, and the prior curve of the calibrated
decision. ``ragproxy calibrate --warm LOG.jsonl [--namespace NS] [--tenant T]``: the calibrated decision started from
an app's logged questions and answers (:mod:`commands.calibrate_warm`).

The CSV has a header with ``question1``, ``question2``, ``is_duplicate`` (1/0) and, optionally, ``namespace``
(``--namespace`` names the namespace of a file without one) and ``same_answer`` (1/0, or empty where not judged:
would one cached answer serve both questions?). ``--labels same_answer`` reads a pair's label from ``same_answer``
where it is given and from ``is_duplicate`` elsewhere. For each namespace it embeds the questions with the
configured local model, applies the configured guards, and prints the lowest threshold where the one-sided 95% upper
bound of the share of wrong hits (non-duplicate pairs at or above it, guard-vetoed pairs excluded) is within
``--target`` (Wilson's bound over these pairs: a fixed threshold for traffic like them; the proxy's own calibration
learns each namespace's threshold from its traffic, :mod:`tiers.calibration`), and the recall it buys (duplicate
pairs at or above it / duplicate pairs). ``--write`` puts them into ``cache.l2.namespace_thresholds`` of a YAML
config file (created if missing, other keys kept). ``--curve`` also prints the wrong-hit share at or above every
threshold of :data:`tiers.calibration.GRID`; ``--half calibration|held-out`` keeps one deterministic half of the
pairs (:func:`tiers.labelled_pairs.half_of`). ``--prior`` prints
:data:`tiers.calibration.PRIOR_WRONG_SHARE` and :data:`tiers.calibration.PRIOR_PAIRS` as measured on the pairs
(:func:`prior_curve`), ready to paste.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import yaml

from normalizer.guards import veto
from tiers.calibration import GRID, cell_of, upper_bound
from tiers.embedders import DEFAULT_RUNTIME
from tiers.labelled_pairs import HALVES, LABELS, LabelledPair, PairsError, half_of, read_pairs

if TYPE_CHECKING:
    from proxy.assembly.config import Settings

MIN_TOP_PAIRS = 100
"""Pairs the prior's top block pools at least (the highest cells hold few pairs, and decide the first hits)."""


@dataclass(frozen=True, slots=True)
class Choice:
    """The calibrated threshold of one namespace (``None``: no threshold meets the target)."""

    namespace: str
    threshold: float | None
    wrong_hit_rate: float | None
    recall: float
    pairs: int
    curve: tuple[tuple[float, float | None, float], ...]  # (threshold, wrong-hit share, recall)
    wrong_hit_rate_bound: float | None = None
    """The share's one-sided 95% upper bound (:func:`tiers.calibration.upper_bound`) at the threshold."""


def choose(namespace: str, scores: Sequence[float], duplicate: Sequence[bool], target: float,
           grid: Iterable[float] = GRID) -> Choice:
    """The lowest threshold of ``grid`` where the Wilson upper bound of the wrong-hit share is within ``target``, from
    pair scores (vetoed pairs scored 0)."""
    score = np.asarray(scores, dtype=np.float64)
    same = np.asarray(duplicate, dtype=bool)
    positives = max(int(same.sum()), 1)
    curve = []
    counts = []
    for threshold in grid:
        hits = score >= threshold
        count = int(hits.sum())
        share = float((hits & ~same).sum() / count) if count else None
        curve.append((threshold, share, float((hits & same).sum() / positives)))
        counts.append(count)
    for (threshold, share, recall), count in zip(curve, counts, strict=True):
        if share is not None and (bound := upper_bound(share, count)) <= target:
            return Choice(namespace, threshold, share, recall, len(score), tuple(curve), bound)
    return Choice(namespace, None, None, 0.0, len(score), tuple(curve))


def prior_curve(scores: Sequence[float], same: Sequence[bool]) -> tuple[list[float], list[int]]:
    """Per :data:`~tiers.calibration.GRID` cell: the share of pairs needing different answers and the number of
    pairs, made non-increasing from cell to cell (adjacent cells that disagree are pooled: pool-adjacent-violators)
    and pooled over at least :data:`MIN_TOP_PAIRS` pairs from the top."""
    pairs, wrong = [0] * len(GRID), [0] * len(GRID)
    for score, alike in zip(scores, same, strict=True):
        cell = cell_of(score)
        if cell is not None:
            pairs[cell] += 1
            wrong[cell] += not alike
    blocks: list[list[int]] = []  # [wrong, pairs, cells]
    for cell in range(len(GRID)):
        blocks.append([wrong[cell], pairs[cell], 1])
        while len(blocks) > 1 and (blocks[-2][1] == 0 or blocks[-1][1] == 0
                                   or blocks[-2][0] * blocks[-1][1] < blocks[-1][0] * blocks[-2][1]):
            last = blocks.pop()
            blocks[-1] = [blocks[-1][0] + last[0], blocks[-1][1] + last[1], blocks[-1][2] + last[2]]
    while len(blocks) > 1 and blocks[-1][1] < MIN_TOP_PAIRS:
        last = blocks.pop()
        blocks[-1] = [blocks[-1][0] + last[0], blocks[-1][1] + last[1], blocks[-1][2] + last[2]]
    shares = [round(w / n, 3) if n else 1.0 for w, n, width in blocks for _ in range(width)]
    return shares, pairs


async def pair_scores(pairs: Sequence[LabelledPair], guards: Sequence[str],
                      runtime: Literal["auto", "onnx", "numpy"] = DEFAULT_RUNTIME,
                      cache_dir: Path | None = None) -> list[float]:
    """Cosine of each pair's questions with the local model, 0 where a guard vetoes the pair."""
    from tiers.embedders import local_embedder

    embedder = local_embedder(runtime, cache_dir)
    try:
        texts = list(dict.fromkeys(q for p in pairs for q in (p.question1, p.question2)))
        rows: dict[str, np.ndarray] = {}
        for start in range(0, len(texts), 64):
            chunk = texts[start:start + 64]
            rows.update(zip(chunk, await embedder.embed(chunk), strict=True))
    finally:
        await embedder.close()
    return [0.0 if guards and veto(p.question1, p.question2, guards) else
            float(np.dot(rows[p.question1], rows[p.question2])) for p in pairs]


def write_thresholds(path: Path, thresholds: dict[str, float]) -> None:
    """Merge ``thresholds`` into ``cache.l2.namespace_thresholds`` of the YAML file at ``path``."""
    config = yaml.safe_load(path.read_text()) if path.exists() else None
    config = config if isinstance(config, dict) else {}
    l2 = config.setdefault("cache", {}).setdefault("l2", {})
    l2.setdefault("namespace_thresholds", {}).update(thresholds)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def warm_from_log(log: Path, namespace: str, tenant: str, settings: Settings) -> int:
    """``--warm``: gather each namespace's evidence from the log, write it into the data directory, say where each
    namespace stands."""
    from commands.calibrate_warm import LogError, gather, read_log
    from proxy.answers.semantic_factory import model_cache_dir
    from tiers.calibration_file import WARM_FILE, save
    from tiers.embedders import local_embedder

    try:
        records = read_log(log, namespace)
    except (OSError, LogError) as exc:
        print(f"ragproxy calibrate: {exc}", file=sys.stderr)
        return 2
    if not records:
        print(f"ragproxy calibrate: {log}: no logged questions", file=sys.stderr)
        return 2
    l2 = settings.cache.l2

    async def run() -> list[Any]:
        embedder = local_embedder(l2.embedder_runtime, model_cache_dir(settings.data_dir))
        try:
            return await gather(records, embedder, l2, tenant)
        finally:
            await embedder.close()

    warmed = asyncio.run(run())
    target = settings.data_dir / WARM_FILE
    save(target, {(w.tenant, w.namespace): w.evidence for w in warmed})
    for w in warmed:
        unjudged = f" ({w.unjudged} comparisons not judged: too few answers to learn from)" if w.unjudged else ""
        print(f"{w.tenant}/{w.namespace}: {w.progress.summary()}{unjudged}")
    print(f"wrote {target}: ragproxy serve with this data directory starts these namespaces from it")
    return 0


def main(argv: list[str]) -> int:
    from proxy.assembly.config import ConfigError, load_settings

    parser = argparse.ArgumentParser(prog="ragproxy calibrate",
                                     description="Fixed L2 thresholds from labelled question pairs, with the recall "
                                     "each buys.")
    parser.add_argument("pairs", type=Path, nargs="?", help="CSV: question1,question2,is_duplicate[,namespace]")
    parser.add_argument("--warm", type=Path, metavar="LOG.jsonl", help="start the calibration of the proxy in this "
                        "data directory from an app's logged questions and answers (JSONL: question, answer, "
                        "namespace?, system?) instead")
    parser.add_argument("--tenant", default="anonymous", help="with --warm: the tenant the log's namespaces belong "
                        "to (default anonymous: open mode)")
    parser.add_argument("--config", help="YAML config whose guards and embedder runtime to use "
                        "(default: $RAGPROXY_CONFIG)")
    parser.add_argument("--target", type=float, default=0.02, help="largest share of wrong hits (default 0.02)")
    parser.add_argument("--namespace", default="default", help="namespace of pairs without a namespace column")
    parser.add_argument("--write", type=Path, metavar="CONFIG.yaml", help="write the thresholds into this config")
    parser.add_argument("--half", choices=HALVES, help="use one deterministic half of the pairs")
    parser.add_argument("--curve", action="store_true", help="print the wrong-hit share at every threshold")
    parser.add_argument("--labels", choices=LABELS, default="is_duplicate",
                        help="the label column (same_answer: where given, is_duplicate elsewhere)")
    parser.add_argument("--prior", action="store_true", help="print the prior curve of the calibrated decision "
                        "(tiers.calibration.PRIOR_WRONG_SHARE and PRIOR_PAIRS)")
    args = parser.parse_args(argv)
    if not 0 < args.target < 1:
        parser.error("--target must be between 0 and 1")
    try:
        settings = load_settings(args.config or os.environ.get("RAGPROXY_CONFIG"))
    except ConfigError as exc:
        print(f"ragproxy calibrate: invalid configuration: {exc}", file=sys.stderr)
        return 2
    l2 = settings.cache.l2
    if (args.warm is None) == (args.pairs is None):
        parser.error("give a CSV of labelled pairs, or --warm LOG.jsonl")
    if args.warm is not None:
        return warm_from_log(args.warm, args.namespace, args.tenant, settings)
    try:
        pairs = read_pairs(args.pairs, args.namespace, args.labels)
    except PairsError as exc:
        print(f"ragproxy calibrate: {exc}", file=sys.stderr)
        return 2
    pairs = [p for p in pairs if args.half is None or half_of(p) == args.half]
    if not pairs:
        print("ragproxy calibrate: no pairs", file=sys.stderr)
        return 2
    scores = asyncio.run(pair_scores(pairs, l2.guards, l2.embedder_runtime, settings.data_dir / "models"))
    chosen: dict[str, float] = {}
    for namespace in sorted({p.namespace for p in pairs}):
        index = [i for i, p in enumerate(pairs) if p.namespace == namespace]
        result = choose(namespace, [scores[i] for i in index], [pairs[i].duplicate for i in index], args.target)
        if result.threshold is None:
            print(f"{namespace}: no threshold keeps wrong hits within {args.target} ({result.pairs} pairs); "
                  "nothing written for it")
        else:
            chosen[namespace] = result.threshold
            print(f"{namespace}: threshold {result.threshold:.2f}: wrong-hit share {result.wrong_hit_rate:.4f} "
                  f"(95% bound {result.wrong_hit_rate_bound:.4f}), recall {result.recall:.4f} ({result.pairs} pairs)")
        if args.curve:
            for threshold, share, recall in result.curve:
                shown = "-" if share is None else f"{share:.3f}"
                print(f"  {threshold:.2f} wrong {shown} recall {recall:.3f}")
    if args.prior:
        shares, counts = prior_curve(scores, [p.duplicate for p in pairs])
        print(f"PRIOR_WRONG_SHARE = ({', '.join(f'{v:.3f}' for v in shares)})")
        print(f"PRIOR_PAIRS = ({', '.join(map(str, counts))})")
    if args.write is not None and chosen:
        write_thresholds(args.write, chosen)
        print(f"wrote cache.l2.namespace_thresholds to {args.write}")
    return 0
