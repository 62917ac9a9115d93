#!/usr/bin/env python3
"""A llama.cpp-named Qwen2.5-VL text GGUF for tests/qwen25_vl_gguf_test.cc, written by the `gguf`
package (llama.cpp's gguf-py) with numpy only, the way llama.cpp's convert_hf_to_gguf.py
(Qwen2VLModel, MODEL_ARCH.QWEN2VL) writes one:

* the language model's tensors of the tiny Qwen-Image pipeline's text encoder
  (tests/golden/qwen_image_pipeline/pipeline/text_encoder/model.safetensors, float32), renamed by
  gguf-py's own tensor name map for QWEN2VL (not flowkv's table: the test checks flowkv's table
  against it), the vision tower and lm_head left out (llama.cpp puts the tower in an mmproj file;
  this model ties its embeddings, so there is no output.weight);
* matrices stored as F16 (convert_hf_to_gguf.py --outtype f16: 2-D weights to F16, norms and
  biases kept F32), no q/k permutation (Qwen2VLModel only renames);
* the metadata keys convert_hf_to_gguf.py writes for it (qwen2vl.embedding_length, block_count,
  feed_forward_length, attention.head_count, head_count_kv, layer_norm_rms_epsilon,
  rope.freq_base, rope.dimension_sections padded with a zero to 4, context_length), and a
  tokenizer.ggml.tokens list (placeholder texts, the four vision tokens at the config's ids).

Writes tests/golden/qwen25_vl_gguf/text_encoder-f16.gguf, and one_layer.gguf: a 3 KB file of the
same form (one layer of width 8, random F32 weights, a six-token list), small enough to be a
good seed for the GGUF fuzz target (tests/fuzz/make_seeds.sh copies every golden .gguf).
Deterministic: running it again writes identical files.
Usage: python/ref/.venv/bin/python python/ref/dump_qwen25_vl_gguf.py [out_dir]
"""
import json
import os
import sys

import numpy as np
import gguf
from safetensors.numpy import load_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SRC = os.path.join(ROOT, "tests", "golden", "qwen_image_pipeline", "pipeline", "text_encoder")
VISION_TOKENS = {"image_token_id": "<|image_pad|>", "video_token_id": "<|video_pad|>",
                 "vision_start_token_id": "<|vision_start|>", "vision_end_token_id": "<|vision_end|>"}


def one_layer(path):
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "qwen2vl")
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(8)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_sections([1, 1, 0, 0])
    w.add_context_length(64)
    w.add_token_list(["a", "<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", "b"])

    def f(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    w.add_tensor("token_embd.weight", f(6, 8))
    w.add_tensor("output_norm.weight", f(8))
    for name, shape in [("attn_norm.weight", (8,)), ("attn_q.weight", (8, 8)), ("attn_q.bias", (8,)),
                        ("attn_k.weight", (4, 8)), ("attn_k.bias", (4,)), ("attn_v.weight", (4, 8)),
                        ("attn_v.bias", (4,)), ("attn_output.weight", (8, 8)), ("ffn_norm.weight", (8,)),
                        ("ffn_gate.weight", (8, 8)), ("ffn_up.weight", (8, 8)), ("ffn_down.weight", (8, 8))]:
        w.add_tensor("blk.0." + name, f(*shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "tests", "golden", "qwen25_vl_gguf")
    os.makedirs(out, exist_ok=True)
    cfg = json.load(open(os.path.join(SRC, "config.json")))
    t = cfg["text_config"]
    weights = load_file(os.path.join(SRC, "model.safetensors"))
    n_blocks = t["num_hidden_layers"]
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2VL, n_blocks)

    w = gguf.GGUFWriter(os.path.join(out, "text_encoder-f16.gguf"), "qwen2vl")
    w.add_name("tiny Qwen2.5-VL text (flowkv test)")
    w.add_context_length(t["max_position_embeddings"])
    w.add_embedding_length(t["hidden_size"])
    w.add_block_count(n_blocks)
    w.add_feed_forward_length(t["intermediate_size"])
    w.add_head_count(t["num_attention_heads"])
    w.add_head_count_kv(t["num_key_value_heads"])
    w.add_rope_freq_base(t["rope_parameters"]["rope_theta"])
    w.add_layer_norm_rms_eps(t["rms_norm_eps"])
    w.add_rope_dimension_sections(list(t["rope_parameters"]["mrope_section"]) + [0])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    tokens = [f"<tok{i}>" for i in range(t["vocab_size"])]
    for key, text in VISION_TOKENS.items():
        tokens[cfg[key]] = text
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)

    names = []
    for name in sorted(weights):
        if name.startswith("visual.") or name.startswith("model.visual.") or name == "lm_head.weight":
            continue
        new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if new is None:
            raise RuntimeError(f"gguf-py has no QWEN2VL name for {name}")
        data = weights[name].astype(np.float32)
        if data.ndim == 2:
            data = data.astype(np.float16)
        w.add_tensor(new, data)
        names.append((name, new))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for name, new in names:
        print(f"{name} -> {new}")
    one_layer(os.path.join(out, "one_layer.gguf"))


if __name__ == "__main__":
    main()
