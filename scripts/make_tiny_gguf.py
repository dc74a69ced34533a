"""Write a random-weight Llama model as GGUF, for benchmarks and tests against a real llama-server.

    python scripts/make_tiny_gguf.py [--out ~/.cache/ragproxy/tiny-llama.gguf] [--vocab PATH] [--shape tiny|1b|8b]
        [--type f16|q8_0] [--embd N] [--layers N] [--heads N] [--kv-heads N] [--ff N] [--ctx N] [--force]

The weights are random (normal, std 0.02; norms 1), so the model writes nonsense, but its prefill cost and KV
cache are those of a real transformer of that shape. The tokenizer is copied from one of the tokenizer-only
``ggml-vocab-*.gguf`` files that llama.cpp vendors (``scripts/build_llama_server.sh`` copies them to
``~/.cache/ragproxy/vocab``; default ``ggml-vocab-llama-spm.gguf``, 32,000 tokens). A ChatML chat template is
added so ``/v1/chat/completions`` works. Idempotent: an existing output file is kept unless ``--force``.

Shapes (``--shape``; the single options override a preset):

* ``tiny`` (default) — 1 layer, 768 wide, 6 heads, feed-forward 3072. Wide and shallow on purpose: per token,
  the weight matmuls (~19 MFLOP) outweigh attention over a 2k context (~5 MFLOP) as in real 7B-class models, so
  the time of a prefill follows the tokens computed (a narrow model would spend most of it attending to the
  cached prefix). Measured on the project's shared 2-core machine with llama-server ``-t 1``: ~1.1 s for a cold
  2,360-token prompt, ~0.2-0.4 s when ~1,400 of ~1,900 tokens are cached. With two threads on a busy 2-core
  machine the threads wait on each other and prefill is several times slower.
* ``1b`` — 16 layers, 2048 wide, 32 heads with 8 KV heads (grouped-query attention), feed-forward 8192: ~1.0B
  parameters with the 32k vocabulary (a GPU shape).
* ``8b`` — the Llama-3-8B layout: 32 layers, 4096 wide, 32 heads with 8 KV heads, feed-forward 14336: ~7.0B
  parameters with the 32k vocabulary (Llama 3's 128k vocabulary would add ~0.8B in the embedding and output,
  which a one-token completion barely touches). 14 GB in F16, 7.5 GB in Q8_0.

Random values do not change the cost of a dense matmul, so every tensor is a slice of one pool of random values
drawn once (drawing 7 billion normals would take minutes; slices of a pool take no memory of their own).
``--type q8_0`` writes llama.cpp's 8-bit blocks (a scale and 32 int8 values each): half the memory of F16, for
GPUs that could not hold four replicas of the 8b shape in F16.
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


SHAPES: dict[str, dict[str, int]] = {
    "tiny": {"embd": 768, "layers": 1, "heads": 6, "kv_heads": 6, "ff": 3072},
    "1b": {"embd": 2048, "layers": 16, "heads": 32, "kv_heads": 8, "ff": 8192},
    "8b": {"embd": 4096, "layers": 32, "heads": 32, "kv_heads": 8, "ff": 14336},
}
"""Model shapes by name (see the module docs)."""

Q8_BLOCK = 32
"""Values per Q8_0 block (stored as an F16 scale and 32 int8 values: 34 bytes)."""


class RandomPool:
    """Weights as slices of one pool of random values (F16 values, or Q8_0 blocks as raw bytes)."""

    def __init__(self, rng: np.random.Generator, largest: int, kind: str) -> None:
        self.kind = kind
        self.rng = rng
        if kind == "q8_0":
            blocks = largest // Q8_BLOCK
            raw = np.empty((blocks, 2 + Q8_BLOCK), dtype=np.uint8)
            raw[:, :2] = np.frombuffer(np.float16(0.02 / 73).tobytes(), dtype=np.uint8)  # std of the values: 0.02
            raw[:, 2:] = rng.integers(-127, 128, size=(blocks, Q8_BLOCK), dtype=np.int8).view(np.uint8)
            self.pool = raw.reshape(-1)
        else:
            self.pool = (rng.standard_normal(largest, dtype=np.float32) * 0.02).astype(np.float16)

    def add(self, writer: GGUFWriter, name: str, rows: int, cols: int) -> None:
        if self.kind == "q8_0":
            width = cols // Q8_BLOCK * (2 + Q8_BLOCK)
            start = int(self.rng.integers(0, len(self.pool) // (2 + Q8_BLOCK) - rows * cols // Q8_BLOCK + 1))
            offset = start * (2 + Q8_BLOCK)
            data = self.pool[offset:offset + rows * width].reshape(rows, width)
            writer.add_tensor(name, data, raw_dtype=GGMLQuantizationType.Q8_0)
            return
        start = int(self.rng.integers(0, len(self.pool) - rows * cols + 1))
        writer.add_tensor(name, self.pool[start:start + rows * cols].reshape(rows, cols),
                          raw_dtype=GGMLQuantizationType.F16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=CACHE / "tiny-llama.gguf")
    parser.add_argument("--vocab", type=Path, default=CACHE / "vocab" / "ggml-vocab-llama-spm.gguf")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--type", choices=["f16", "q8_0"], default="f16", help="weight type of the matrices")
    for option in ("embd", "layers", "heads", "kv-heads", "ff"):
        parser.add_argument(f"--{option}", type=int, help="overrides the shape's value")
    parser.add_argument("--ctx", type=int, default=16384)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    shape = {key: getattr(args, key) or value for key, value in SHAPES[args.shape].items()}
    if args.out.exists() and not args.force:
        print(args.out)
        return 0
    if not args.vocab.exists():
        print(f"no vocab file {args.vocab}: run scripts/build_llama_server.sh first", file=sys.stderr)
        return 1
    embd, layers, heads, kv_heads, ff = (shape[k] for k in ("embd", "layers", "heads", "kv_heads", "ff"))
    if args.type == "q8_0" and (embd % Q8_BLOCK or ff % Q8_BLOCK):
        print(f"q8_0 needs widths divisible by {Q8_BLOCK}", file=sys.stderr)
        return 1
    head_dim = embd // heads
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    writer = GGUFWriter(tmp, "llama")
    writer.add_name(f"ragproxy-random-llama-{args.shape}")
    writer.add_context_length(args.ctx)
    writer.add_embedding_length(embd)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(7 if args.type == "q8_0" else 1)  # mostly Q8_0 / mostly F16
    vocab_size = copy_tokenizer(args.vocab, writer)
    writer.add_vocab_size(vocab_size)
    writer.add_chat_template(CHATML)

    rng = np.random.default_rng(args.seed)
    pool = RandomPool(rng, max(vocab_size * embd, ff * embd), args.type)
    ones = np.ones(embd, dtype=np.float32)
    kv_dim = head_dim * kv_heads
    pool.add(writer, "token_embd.weight", vocab_size, embd)
    writer.add_tensor("output_norm.weight", ones)
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", ones)
        pool.add(writer, f"blk.{i}.attn_q.weight", embd, embd)
        pool.add(writer, f"blk.{i}.attn_k.weight", kv_dim, embd)
        pool.add(writer, f"blk.{i}.attn_v.weight", kv_dim, embd)
        pool.add(writer, f"blk.{i}.attn_output.weight", embd, embd)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", ones)
        pool.add(writer, f"blk.{i}.ffn_gate.weight", ff, embd)
        pool.add(writer, f"blk.{i}.ffn_up.weight", ff, embd)
        pool.add(writer, f"blk.{i}.ffn_down.weight", embd, ff)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
