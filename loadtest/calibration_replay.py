"""``python -m loadtest.calibration_replay --pairs PATH [--half H] [--mix S ...] [--seeds N] [--json]``: the L2 hit
decision (:class:`tiers.calibration.Calibrator`) replayed offline on the ``fidelity`` bench's ``shared`` traffic, in
seconds instead of minutes: no proxy, no HTTP.

Each pair in order, as the proxy sees it in ``--mode shared``: the first question is forwarded (its answer cached),
the second one scores the cosine of the two (the proxy's default embedder; vectors cached in a temporary file) unless
a default guard vetoes the match; at 0.70 or more the lookup is counted (``look``), then served at or above the
namespace's threshold unless sampled for verification, else forwarded and compared: the cached and the fresh
answer, worded anew like the bench's ``--answers varied`` (:class:`loadtest.sampled_answers.SampledAnswers`), judged
by the proxy's own answer check. Figures per run: recall, wrong-hit share, first semantic hit, the threshold at the
end, and the hindsight oracle's recall at the bound (:func:`loadtest.fidelity_traffic.best_at`). What it leaves out:
retyped second questions (exact hits through HTTP) and the background timing of comparisons. Tune on ``--half
calibration`` (the default here); the bench through HTTP on the held-out half confirms.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from loadtest.bench.fidelity import embed_all
from loadtest.fidelity_traffic import best_at, clusters, oracle_curve, same, sample_mix
from loadtest.sampled_answers import SampledAnswers
from normalizer.guards import veto
from proxy.assembly.config import load_settings
from tiers.answer_check import AnswerAgreement
from tiers.calibration import GRID, Calibrator
from tiers.labelled_pairs import HALVES, LabelledPair, half_of, read_pairs
from tiers.semantic import MAX_UNJUDGED

Vectors = dict[str, np.ndarray]
MakeCalibrator = Callable[[float, random.Random], Calibrator]
"""A calibrator for a target and a random generator (of its verification draws)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One replayed run."""

    pairs: int
    wanted: int
    recalled: int
    hits: int
    wrong: int
    first_hit: int | None
    threshold: float
    estimate: float | None
    bound: float | None
    oracle_recall: float | None

    @property
    def recall(self) -> float:
        return self.recalled / self.wanted if self.wanted else 0.0

    @property
    def wrong_share(self) -> float:
        return self.wrong / self.hits if self.hits else 0.0

    def as_dict(self) -> dict[str, Any]:
        ratio = self.recall / self.oracle_recall if self.oracle_recall else None
        return {"pairs": self.pairs, "hits": self.hits, "wrong": self.wrong, "wrong_share": round(self.wrong_share, 4),
                "recall": round(self.recall, 4), "oracle_recall": self.oracle_recall,
                "recall_ratio": None if ratio is None else round(ratio, 3), "first_hit": self.first_hit,
                "threshold": self.threshold, "estimate": self.estimate, "bound": self.bound}


def vectors_for(questions: Sequence[str], cache: Path) -> Vectors:
    """The default embedder's vectors of ``questions``, read from (and added to) ``cache``."""
    known: Vectors = {}
    if cache.exists():
        known = {q: np.asarray(v, dtype=np.float32) for q, v in orjson.loads(cache.read_bytes()).items()}
    missing = [q for q in dict.fromkeys(questions) if q not in known]
    if missing:
        known.update(asyncio.run(embed_all(missing)))
        cache.write_bytes(orjson.dumps({q: v.tolist() for q, v in known.items()}))
    return known


def replay(pairs: Sequence[LabelledPair], by_question: dict[str, int], vectors: Vectors, calibrator: Calibrator,
           vetoed: Callable[[str, str], bool], check_cut: float, seed: int) -> Outcome:
    """The ``shared`` traffic of ``pairs`` through ``calibrator`` (one namespace)."""
    answers, check = SampledAnswers(seed), AnswerAgreement(check_cut)
    waiting: list[tuple[float, str, str, str, str]] = []
    """Comparisons held until the check is ready (:data:`tiers.semantic.MAX_UNJUDGED`)."""

    def judge() -> None:
        for score, cached, fresh, first, second in waiting:
            calibrator.observe("default", score, check.agree(cached, fresh, (first, second)))
        waiting.clear()

    def forward(question: str) -> str:
        text = answers.answer(question, by_question[question])
        check.learn(text)
        if check.ready:
            judge()
        return text

    wanted = recalled = hits = wrong = 0
    first_hit: int | None = None
    for at, pair in enumerate(pairs, 1):
        alike = same(pair, by_question)
        wanted += alike
        cached = forward(pair.question1)
        score = float(np.dot(vectors[pair.question1], vectors[pair.question2]))
        if score < GRID[0] or vetoed(pair.question2, pair.question1):
            forward(pair.question2)
            continue
        calibrator.look("default", score)
        if score >= calibrator.threshold("default") and not calibrator.should_verify("default"):
            hits += 1
            wrong += not alike
            recalled += alike
            first_hit = first_hit or at
            continue
        fresh = forward(pair.question2)
        waiting.append((score, cached, fresh, pair.question1, pair.question2))
        waiting[:] = waiting[-MAX_UNJUDGED:]
        if check.ready:
            judge()
    point = calibrator.operating("default")
    return Outcome(len(pairs), wanted, recalled, hits, wrong, first_hit, point.threshold,
                   point.estimated_wrong_hit_rate, point.wrong_hit_rate_bound, None)


def run(args: argparse.Namespace, make: MakeCalibrator | None = None) -> list[dict[str, Any]]:
    """Every (mix, seed) of ``args``: the replayed outcome and the oracle's recall (``make``: the decision replayed;
    default: the proxy's own at its defaults)."""
    l2 = load_settings(None).cache.l2
    everything = read_pairs(args.pairs, labels="same_answer")
    by_question = clusters(everything)
    half = [p for p in everything if half_of(p) == args.half]
    tag = hashlib.sha256(str(args.pairs.resolve()).encode()).hexdigest()[:12]
    cache = Path(tempfile.gettempdir()) / f"ragproxy-replay-vectors-{tag}-{args.half}.json"
    vectors = vectors_for([q for p in half for q in (p.question1, p.question2)], cache)
    guards = list(l2.guards)

    def vetoed(a: str, b: str) -> bool:
        return bool(guards) and veto(a, b, guards) is not None

    make = make or (lambda target, rng: Calibrator(target, verify_fraction=l2.verify_fraction, rng=rng))
    rows = []
    for mix in args.mix:
        for seed in range(1, args.seeds + 1):
            pairs = sample_mix(half, by_question, mix, args.count, seed) if mix > 0 else half[:args.count]
            outcome = replay(pairs, by_question, vectors, make(l2.max_wrong_hit_rate, random.Random(seed)), vetoed,
                             l2.answer_agreement, seed)
            oracle = best_at(oracle_curve(pairs, vectors, by_question, vetoed), l2.max_wrong_hit_rate)
            outcome = replace(outcome, oracle_recall=round(oracle["recall"], 4) if oracle else None)
            rows.append({"mix": mix, "seed": seed, **outcome.as_dict()})
    return rows


def parser() -> argparse.ArgumentParser:
    found = argparse.ArgumentParser(prog="python -m loadtest.calibration_replay", description=__doc__)
    found.add_argument("--pairs", type=Path, required=True, help="qqp_dev_relabelled.csv (never shipped)")
    found.add_argument("--half", choices=HALVES, default="calibration")
    found.add_argument("--mix", type=float, nargs="+", default=[0.8],
                       help="shares of same-answer pairs (0: the half's pairs as they come)")
    found.add_argument("--seeds", type=int, default=3, help="seeds 1..N of each mix")
    found.add_argument("--count", type=int, default=1500)
    found.add_argument("--json", action="store_true")
    return found


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(argv)
    rows = run(args)
    for row in rows:
        print(orjson.dumps(row).decode() if args.json else
              f"mix {row['mix']} seed {row['seed']}: recall {row['recall']} / oracle {row['oracle_recall']} = "
              f"{row['recall_ratio']}, wrong {row['wrong']}/{row['hits']} ({row['wrong_share']}), first hit "
              f"{row['first_hit']}, end {row['threshold']} / {row['estimate']} / {row['bound']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
