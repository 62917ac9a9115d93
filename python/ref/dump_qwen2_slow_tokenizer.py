"""Golden cases for flowkv's Qwen2Tokenizer loader (Tokenizer::from_folder without a tokenizer.json,
src/text/tokenizer.cc): tiny tokenizer folders holding only the "slow" files the released Qwen-Image
pipeline folders carry (vocab.json, merges.txt, tokenizer_config.json), and what transformers 5.24
builds from them (Qwen2Tokenizer.from_pretrained, as diffusers loads a pipeline's tokenizer/): its added tokens (ids, contents, flags), its
length and the ids of a few texts, plain (`tokenizers`' encode of the backend) and through
transformers' __call__ (add_special_tokens=True, the post-processor included).

    python/ref/.venv/bin/python python/ref/dump_qwen2_slow_tokenizer.py --out tests/golden/tokenizer/qwen2_slow

With --check-qwen3 DIR (DIR holding the unpacked tests/golden/tokenizer/qwen3_tokenizer.tar.xz) it
writes nothing into the repository: it derives Qwen2Tokenizer's files from DIR/tokenizer.json as
tests/tokenizer_test.cc does (vocab.json = model.vocab; merges.txt = "#version: 0.2" then one
"a b" line a merge; the package's tokenizer_config.json) and checks that transformers builds from
them the tokenizer of the tokenizer.json (normalizer, pre-tokenizer, model, added tokens, decoder,
leaving out the fields that change no id or decoded text; the post-processor differs: a
TemplateProcessing that adds nothing, for ByteLevel's).

Each case covers a rule of the assembly: added_tokens_decoder order and flags ("normalized"
defaulting to not "special"), named special tokens missing from added_tokens_decoder (Qwen2's
"<|endoftext|>" defaults, additional_special_tokens, a model-specific *_token, an AddedToken
object), an added token that vocab.json holds, merges.txt read as `tokenizers` reads it ("#version"
lines anywhere, CRLF line ends, a pair given twice keeping its last rank). Two runs write
identical bytes. Needs transformers and tokenizers (no model weights).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil

from ref_common import check_pins, versions


def byte_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: byte b -> its printable character."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def base_vocab(extra: list[str]) -> dict[str, int]:
    vocab = {c: i for i, c in enumerate(byte_alphabet())}
    for tok in extra:
        vocab[tok] = len(vocab)
    return vocab


def added(content, special, **flags):
    d = {"content": content, "lstrip": False, "normalized": not special, "rstrip": False,
         "single_word": False, "special": special}
    d.update(flags)
    return d


TEXTS = ["abc", "<B><E><P><M><X><img>", "abcab cab", "a b c", "<|im_start|>user\nabc<|im_end|>\n", "x <L>y  <R>  z",
         "word words aword", "e\u0301! \u00e9!", "<|endoftext|><extra><img>", "<EOS> <EOS>",
         "It's WE'LL 12345 \r\n\n  tabs\t\tend  "]

EXTRA = ["ab", "bc", "abc", "Ġa", "ca", "cab"]
MERGES = ["a b", "ab c", "b c", "Ġ a", "c a", "ca b"]

CASES = {
    # The Qwen layout: every named token in added_tokens_decoder; flags of all kinds; merges.txt
    # with a "#version" header, one in the middle too, CRLF line ends.
    "qwen_layout": dict(
        vocab=base_vocab(EXTRA),
        merges="#version: 0.2\r\n" + "\r\n".join(MERGES[:3]) + "\r\n#version: again\r\n"
        + "\r\n".join(MERGES[3:]) + "\r\n",
        config={
            "add_bos_token": False, "add_prefix_space": False,
            "added_tokens_decoder": {
                "262": added("<|endoftext|>", True),
                "263": added("<|im_start|>", True),
                "264": added("<|im_end|>", True),
                "265": added("<L>", True, lstrip=True, normalized=False),
                "266": added("<R>", False, rstrip=True, normalized=False),
                "267": added("word", False, single_word=True, normalized=False),
                "268": added("é!", False, normalized=True),
            },
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
            "errors": "replace", "model_max_length": 32768, "pad_token": "<|endoftext|>",
            "split_special_tokens": False, "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
        }),
    # Named special tokens outside added_tokens_decoder are added after it, in transformers'
    # order: eos/unk/pad missing -> Qwen2's "<|endoftext|>"; an extra special token; a
    # model-specific *_token; added_tokens_decoder's ids given out of order; "normalized"
    # missing (defaults to not special).
    "named_outside_decoder": dict(
        vocab=base_vocab(EXTRA),
        merges="\n".join(MERGES),  # no header, no final newline
        config={
            "added_tokens_decoder": {
                "263": {"content": "<R>", "special": False, "rstrip": True},
                "262": {"content": "<L>", "special": True, "lstrip": True},
            },
            "additional_special_tokens": ["<extra>", "<L>"],
            "image_token": "<img>",
            "tokenizer_class": "Qwen2TokenizerFast",
        }),
    # An eos_token given as an AddedToken object (lstrip) outside added_tokens_decoder, an added
    # token that vocab.json holds (at its vocab id), a pair merged twice (last rank wins).
    "object_token_and_vocab_token": dict(
        vocab=base_vocab(EXTRA),
        merges="#version: 0.2\nb c\na b\nb c\nab c\n",
        config={
            "added_tokens_decoder": {
                "257": added("bc", False, normalized=False),
                "262": added("<|endoftext|>", True),
            },
            "eos_token": {"__type": "AddedToken", "content": "<EOS>", "lstrip": True,
                          "normalized": False, "rstrip": False, "single_word": False,
                          "special": True},
            "pad_token": "<|endoftext|>", "unk_token": None,
        }),
    # Named tokens all new, in a file order other than transformers' (bos, eos, unk, sep, pad,
    # cls, mask, then model-specific ones, then extra_special_tokens), an empty
    # added_tokens_decoder, extra_special_tokens as an object.
    "named_order": dict(
        vocab=base_vocab(EXTRA),
        merges="#version: 0.2\n" + "\n".join(MERGES) + "\n",
        config={
            "added_tokens_decoder": {},
            "pad_token": "<P>", "mask_token": "<M>", "extra_special_tokens": {"x": "<X>"},
            "eos_token": "<E>", "bos_token": "<B>", "unk_token": None, "image_token": "<img>",
            "tokenizer_class": "Qwen2Tokenizer",
        }),
}


def check_qwen3(src: str):
    import tempfile
    from transformers import Qwen2Tokenizer

    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump(tj["model"]["vocab"], f, ensure_ascii=False)
        with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8", newline="") as f:
            f.write("#version: 0.2\n")
            for a, b in tj["model"]["merges"]:
                f.write(f"{a} {b}\n")
        shutil.copy(os.path.join(src, "tokenizer_config.json"), d)
        built = json.loads(Qwen2Tokenizer.from_pretrained(d).backend_tokenizer.to_str())
    # Fields that change no id and no decoded text: ByteLevel's trim_offsets (offsets only), and
    # the ByteLevel decoder's add_prefix_space / trim_offsets / use_regex (its decode ignores them).
    for t in (tj, built):
        for p in t["pre_tokenizer"]["pretokenizers"]:
            p.pop("trim_offsets", None)
        t["decoder"] = {"type": t["decoder"]["type"]}
    bad = [k for k in tj if k not in ("post_processor", "version") and tj[k] != built.get(k)]
    assert built["post_processor"]["type"] == "TemplateProcessing" and not built["post_processor"][
        "special_tokens"], built["post_processor"]
    print("differs:" if bad else "same tokenizer (post-processor aside)", *bad)
    return not bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--check-qwen3", metavar="DIR")
    args = ap.parse_args()
    check_pins()
    if args.check_qwen3:
        raise SystemExit(0 if check_qwen3(args.check_qwen3) else 1)
    if not args.out:
        ap.error("--out or --check-qwen3 is needed")
    from transformers import Qwen2Tokenizer

    if os.path.isdir(args.out):
        shutil.rmtree(args.out)
    os.makedirs(args.out)
    with open(os.path.join(args.out, ".gitattributes"), "w") as f:
        f.write("# Byte-exact: merges.txt of qwen_layout has CRLF line ends on purpose (the loader "
                "must read them).\n* -text\n")
    expected = {"versions": versions(), "texts": TEXTS, "cases": {}}
    for name, case in CASES.items():
        d = os.path.join(args.out, name)
        os.makedirs(d)
        with open(os.path.join(d, "vocab.json"), "w", encoding="utf-8") as f:
            json.dump(case["vocab"], f, ensure_ascii=False)
        with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8", newline="") as f:
            f.write(case["merges"])
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(case["config"], f, ensure_ascii=False, indent=1)
            f.write("\n")
        tok = Qwen2Tokenizer.from_pretrained(d)  # as diffusers loads a pipeline's tokenizer/
        backend = tok.backend_tokenizer
        special = set(tok.all_special_ids)
        added_tokens = []
        for i, t in sorted(backend.get_added_tokens_decoder().items()):
            added_tokens.append({"id": i, "content": t.content, "special": t.special or i in special,
                                 "lstrip": t.lstrip, "rstrip": t.rstrip,
                                 "single_word": t.single_word, "normalized": t.normalized})
        plain = [backend.encode(t, add_special_tokens=False).ids for t in TEXTS]
        called = [tok(t)["input_ids"] for t in TEXTS]
        expected["cases"][name] = {"class": type(tok).__name__, "len": len(tok),
                                   "added": added_tokens, "plain_ids": plain, "ids": called}
        print(name, type(tok).__name__, len(tok), [a["content"] for a in added_tokens])
    with open(os.path.join(args.out, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
