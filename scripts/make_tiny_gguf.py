"""Write a small random-weight Llama model as GGUF, for benchmarks and tests against a real llama-server.

    python scripts/make_tiny_gguf.py [--out ~/.cache/ragproxy/tiny-llama.gguf] [--vocab PATH]
        [--embd 768] [--layers 1] [--heads 6] [--kv-heads 6] [--ff 3072] [--ctx 16384] [--force]

The weights are random (normal, std 0.02; norms 1), so the model writes nonsense, but its prefill cost and KV
cache are those of a real transformer of that shape. The tokenizer is copied from one of the tokenizer-only
``ggml-vocab-*.gguf`` files that llama.cpp vendors (``scripts/build_llama_server.sh`` copies them to
``~/.cache/ragproxy/vocab``; default ``ggml-vocab-llama-spm.gguf``, 32,000 tokens). A ChatML chat template is
added so ``/v1/chat/completions`` works. Idempotent: an existing output file is kept unless ``--force``.
The default shape is wide and shallow on purpose: per token, the weight matmuls (~19 MFLOP) outweigh attention
over a 2k context (~5 MFLOP) as in real 7B-class models, so the time of a prefill follows the tokens computed
(a narrow model would spend most of it attending to the cached prefix). Measured on this shared machine with
llama-server ``-t 1``: ~1.1 s for a cold 2,360-token prompt, ~0.2-0.4 s when ~1,400 of ~1,900 tokens are cached.
With two threads on a busy 2-core machine the threads wait on each other and prefill is several times slower.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

CACHE = Path.home() / ".cache" / "ragproxy"
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def copy_tokenizer(vocab: Path, writer: GGUFWriter) -> int:
    """Copy every ``tokenizer.*`` field of ``vocab`` into ``writer``; returns the vocabulary size."""
    reader = GGUFReader(vocab)
    size = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        types = field.types
        value = field.contents()
        if types[0] == GGUFValueType.ARRAY:
            writer.add_key_value(name, value, GGUFValueType.ARRAY, sub_type=types[1])
            if name == "tokenizer.ggml.tokens":
                size = len(value)
        else:
            writer.add_key_value(name, value, types[0])
    if not size:
        raise SystemExit(f"{vocab} has no tokenizer.ggml.tokens")
    return size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=CACHE / "tiny-llama.gguf")
    parser.add_argument("--vocab", type=Path, default=CACHE / "vocab" / "ggml-vocab-llama-spm.gguf")
    parser.add_argument("--embd", type=int, default=768)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--kv-heads", type=int, default=6)
    parser.add_argument("--ff", type=int, default=3072)
    parser.add_argument("--ctx", type=int, default=16384)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.force:
        print(args.out)
        return 0
    if not args.vocab.exists():
        print(f"no vocab file {args.vocab}: run scripts/build_llama_server.sh first", file=sys.stderr)
        return 1
    head_dim = args.embd // args.heads
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    writer = GGUFWriter(tmp, "llama")
    writer.add_name("ragproxy-tiny-random-llama")
    writer.add_context_length(args.ctx)
    writer.add_embedding_length(args.embd)
    writer.add_block_count(args.layers)
    writer.add_feed_forward_length(args.ff)
    writer.add_head_count(args.heads)
    writer.add_head_count_kv(args.kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(1)  # mostly F16
    vocab_size = copy_tokenizer(args.vocab, writer)
    writer.add_vocab_size(vocab_size)
    writer.add_chat_template(CHATML)

    rng = np.random.default_rng(args.seed)

    def weight(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    ones = np.ones(args.embd, dtype=np.float32)
    kv_dim = head_dim * args.kv_heads
    writer.add_tensor("token_embd.weight", weight(vocab_size, args.embd), raw_dtype=GGMLQuantizationType.F16)
    writer.add_tensor("output_norm.weight", ones)
    for i in range(args.layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(args.embd, args.embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(kv_dim, args.embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(kv_dim, args.embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(args.embd, args.embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(args.ff, args.embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(args.ff, args.embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(args.embd, args.ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
