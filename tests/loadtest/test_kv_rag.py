"""The kv benchmarks' zipf-rag workload and their end-to-end side's command line: what the workload promises
(a top 5 by Zipf popularity in the order drawn, unique questions, passages the proxy recognises when pasted), and
that ``ragproxy serve`` reads the side's command as the replicas and settings it names."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import yaml

from loadtest.bench._kv_rag import rag_workload, read_questions
from loadtest.bench._kv_serve import serve_command
from loadtest.bench._kv_servers import ROOT
from loadtest.bench._kv_workload import app_messages
from normalizer.prompt_blocks import recognise
from normalizer.repeated_blocks import DEFAULT_MAX_BYTES as REPEATED_BYTES
from normalizer.repeated_blocks import RepeatedBlocks

PROSE = [
    f"Passage {i} of the manual explains how module number {i} opens its files, reads each record in turn, and "
    f"reports what it could not parse to the caller, with the line where record {i * 7} went wrong."
    for i in range(40)
]
QUESTIONS = [f"What does module {i} report when a record cannot be parsed?" for i in range(25)]


def test_each_request_is_a_top_5_of_distinct_documents_and_popular_ones_come_often() -> None:
    work = rag_workload(PROSE, QUESTIONS, requests=400, seed=3)
    assert all(len(docs) == 5 == len(set(docs)) for docs, _ in work.requests)
    counts = Counter(j for docs, _ in work.requests for j in docs)
    assert counts[0] > counts[10] > counts[39]  # Zipf(1.1): rank 1 far more often than the tail
    assert len({q for _, q in work.requests}) == 400  # unique even past the 25 questions given
    assert work.stream and work.present == "pasted"


def test_a_longer_run_extends_the_same_requests() -> None:
    short = rag_workload(PROSE, QUESTIONS, requests=30, seed=3)
    long = rag_workload(PROSE, QUESTIONS, requests=90, seed=3)
    assert long.requests[:30] == short.requests
    assert rag_workload(PROSE, QUESTIONS, requests=30, seed=4).requests != short.requests


def test_pasted_passages_are_what_the_proxy_recognises_in_retrieval_order() -> None:
    work = rag_workload(PROSE, QUESTIONS, requests=20, seed=1, present="pasted")
    for index, (docs, question) in enumerate(work.requests):
        system, user = app_messages(work, index)
        assert system["content"] == work.system and user["content"].endswith(question)
        blocks = recognise(user["content"])
        texts = [user["content"][b.start : b.end] for b in blocks]  # a block is the text after its label
        assert texts == [work.documents[j].text for j in docs]


def test_joined_documents_have_no_shape_to_read_and_come_back_as_they_move() -> None:
    work = rag_workload(PROSE, QUESTIONS, requests=30, seed=1, present="joined")
    learner = RepeatedBlocks(REPEATED_BYTES)
    counted: set[str] = set()
    for index, (docs, question) in enumerate(work.requests):
        _, user = app_messages(work, index)
        texts = [work.documents[j].text for j in docs]
        assert user["content"] == "\n\n".join(texts) + f"\n\nQuestion: {question}"
        assert recognise(user["content"]) == ()  # blank lines only: nothing in the text says where a document ends
        counted.update(learner.observe(user["content"]))
    # the popular documents count once they met other neighbours; the question never does
    assert counted and counted <= {d.text for d in work.documents}


def test_structured_presentation_keeps_the_documents_out_of_the_user_message() -> None:
    work = rag_workload(PROSE, QUESTIONS, requests=3, seed=1, present="structured")
    docs, question = work.requests[0]
    system, user = app_messages(work, 0)  # what the sides without the proxy send: the proxy's own rendering
    assert user["content"] == question and all(work.documents[j].text in system["content"] for j in docs)
    assert recognise(user["content"]) == ()


def test_questions_are_read_from_json_lines_without_repeats(tmp_path: Path) -> None:
    path = tmp_path / "q.jsonl"
    path.write_text(
        '{"question": "who wrote it", "answer": ["x"]}\n\n{"question": "who wrote it?"}\n{"question": "when"}\n'
    )
    assert read_questions(path) == ["who wrote it?", "when?"]


def test_the_serve_side_command_is_read_by_ragproxy_as_its_replicas_and_settings(tmp_path: Path) -> None:
    command = serve_command(
        ["http://127.0.0.1:9001", "http://127.0.0.1:9002"],
        slots=2,
        order="reuse",
        port=9100,
        admin_port=9101,
        data_dir=tmp_path,
        slo_s=0.25,
        settings=["routing.order=shift"],
    )
    assert command[:4] == [sys.executable, "-m", "commands.cli", "serve"]
    done = subprocess.run(
        [sys.executable, "-m", "commands.cli", "check-config", *command[4:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    config = yaml.safe_load(done.stdout)
    assert [(r["url"], r["kind"], r["slots"]) for r in config["upstreams"]["llm"]] == [
        ("http://127.0.0.1:9001", "llamacpp", 2),
        ("http://127.0.0.1:9002", "llamacpp", 2),
    ]
    assert config["routing"]["order"] == "shift"  # the bench's --serve-set comes last and wins
    assert config["routing"]["ttft_slo_s"] == 0.25 and config["cache"]["enabled"] is False
    assert config["server"]["port"] == 9100 and config["admin"]["port"] == 9101
