"""Golden dumps of torch's CPU normal generator: what diffusers' randn_tensor returns for
torch.Generator("cpu").manual_seed(seed) and torch.randn(shape, generator=g, dtype=float32)
(the Klein pipelines' prepare_latents: one call for the whole [B, 128, H/16, W/16] shape).

Run it twice: as is (the machine's capability, AVX2 here) and with ATEN_CPU_CAPABILITY=default
into tests/golden/random/default (torch's libm path, a few cases).
Writes tests/golden/random/<case>.f32 (the values, little-endian float32), bf16_<case>.bf16
(torch.randn in bfloat16, the values' 16 bits) and manifest.json
(seed, shape, file, and for the two draws of one generator the second draw's case).
    python dump_random.py [OUT_DIR]
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ref_common import check_pins  # noqa: E402

check_pins()
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "../../tests/golden/random")
os.makedirs(out, exist_ok=True)
print("torch", torch.__version__, "cpu capability", torch.backends.cpu.get_cpu_capability())

cases = []
shapes = [[1], [7], [15], [16], [17], [31], [33], [100], [4096 + 3], [1, 128, 8, 8]]
seeds = [0, 42, 2**32 + 7, 123456789]
if torch.backends.cpu.get_cpu_capability() == "DEFAULT":  # ATEN_CPU_CAPABILITY=default: a few
    shapes, seeds = [[16], [17], [100], [4096 + 3]], [0]
for seed in seeds:
    for shape in shapes + ([[1, 128, 16, 16]] if seed == 0 else []):
        g = torch.Generator("cpu").manual_seed(seed)
        x = torch.randn(shape, generator=g, dtype=torch.float32)
        name = f"seed{seed}_" + "x".join(map(str, shape))
        x.numpy().astype("<f4").tofile(os.path.join(out, name + ".f32"))
        cases.append({"name": name, "seed": seed, "shape": shape})
# One generator, two draws (the state carries over; the scalar path's cached second normal
# is kept between calls): [3] then [5], and [20] then [3].
for first, second in [] if seeds == [0] else [([3], [5]), ([20], [3]), ([5], [40])]:
    g = torch.Generator("cpu").manual_seed(7)
    a = torch.randn(first, generator=g)
    b = torch.randn(second, generator=g)
    name = f"seq_{first[0]}_{second[0]}"
    torch.cat([a, b]).numpy().astype("<f4").tofile(os.path.join(out, name + ".f32"))
    cases.append({"name": name, "seed": 7, "shape": first, "then": second})
# bfloat16 (a pipeline loaded in bf16 draws its latents in bf16: prepare_latents passes
# prompt_embeds.dtype): the values as their 16 bits.
for seed in ([] if seeds == [0] else [0, 42]):
    for shape in [[1], [7], [16], [17], [100], [4096 + 3], [1, 128, 8, 8]]:
        g = torch.Generator("cpu").manual_seed(seed)
        x = torch.randn(shape, generator=g, dtype=torch.bfloat16)
        name = f"bf16_seed{seed}_" + "x".join(map(str, shape))
        x.view(torch.int16).numpy().astype("<i2").tofile(os.path.join(out, name + ".bf16"))
        cases.append({"name": name, "seed": seed, "shape": shape, "dtype": "bfloat16"})
json.dump({"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "cases": cases}, open(os.path.join(out, "manifest.json"), "w"), indent=1)
print(len(cases), "cases")
