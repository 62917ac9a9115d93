"""A Klein KV pipeline for `flowkv bench-store`: the tiny golden pipeline's tokenizer, text
encoder and VAE with a wider random transformer (8 heads x 64 = width 512, 2 double + 6 single
blocks), so that the transformer dominates a request as it does at real size, plus three 512x512
reference pictures. Usage (the pinned reference venv):

    python/ref/.venv/bin/python python/ref/make_bench_pipeline.py OUT_DIR
    build/tools/flowkv bench-store --pipeline OUT_DIR/kv --image OUT_DIR/ref1.png \\
        --image OUT_DIR/ref2.png --image OUT_DIR/ref3.png --requests 20 --budget-sets 2 \\
        --size 256x256
"""
import pathlib
import shutil
import sys

import numpy as np
import torch
from diffusers import Flux2Transformer2DModel
from PIL import Image

out = pathlib.Path(sys.argv[1])
root = pathlib.Path(__file__).resolve().parents[2]
shutil.rmtree(out / "kv", ignore_errors=True)
shutil.copytree(root / "tests/golden/klein_pipeline/kv/pipeline", out / "kv")
shutil.rmtree(out / "kv/transformer")
torch.manual_seed(0)
m = Flux2Transformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=6,
                            attention_head_dim=64, num_attention_heads=8, joint_attention_dim=48,
                            timestep_guidance_channels=256, mlp_ratio=3.0,
                            axes_dims_rope=(16, 16, 16, 16), rope_theta=2000, eps=1e-6,
                            guidance_embeds=False)
with torch.no_grad():
    for p in m.parameters():
        p.normal_(0, 0.02)
m.save_pretrained(out / "kv/transformer")
for i in range(3):
    y, x = np.mgrid[0:512, 0:512]
    a = np.stack([(x * (i + 1)) % 256, (y * (3 - i)) % 256, ((x + y) * (i + 2) // 2) % 256], -1)
    Image.fromarray(a.astype(np.uint8)).save(out / f"ref{i + 1}.png")
