#!/usr/bin/env bash
# Writes the fuzz targets' seed corpora from tests/golden into OUT_DIR/<target>/ (nothing large
# is committed: safetensors seeds are the files' headers only, their data becomes a hole).
#   tests/fuzz/make_seeds.sh OUT_DIR
set -euo pipefail
out=${1:?usage: make_seeds.sh OUT_DIR}
root="$(cd "$(dirname "$0")/../.." && pwd)"
golden="$root/tests/golden"

targets=(fuzz_safetensors_header fuzz_shard_index fuzz_flux2_config fuzz_qwen_config
         fuzz_inspect_folder fuzz_gguf fuzz_pipeline_index fuzz_png
         fuzz_jpeg fuzz_tokenizer fuzz_tokenizer_json fuzz_qwen3_config
         fuzz_flux2_vae_config fuzz_qwen3_vl fuzz_qwen3_vl_config fuzz_qwen21_vae_config
         fuzz_store_entry fuzz_showcase fuzz_scheduler_config fuzz_qwen2_tokenizer_files
         fuzz_nucleus_config)
for t in "${targets[@]}"; do rm -rf "${out:?}/$t"; mkdir -p "$out/$t"; done

# Bytes of an unsigned integer, little-endian, on stdout.
le() {  # le VALUE NBYTES
  local v=$1 n=$2 i
  for ((i = 0; i < n; i++)); do printf "\\x$(printf %02x $(((v >> (8 * i)) & 255)))"; done
}
header_len() { od -An -t u8 -N8 "$1" | tr -d ' '; }  # the 8-byte little-endian header length
# A name for a seed: where it came from, with / turned into _.
seed_name() { local r=${1#"$golden"/}; echo "${r//\//_}"; }

# safetensors headers: 8 + N bytes of every golden file.
while IFS= read -r f; do
  n=$(header_len "$f")
  head -c $((8 + n)) "$f" >"$out/fuzz_safetensors_header/$(seed_name "$f")"
done < <(find "$golden" -name '*.safetensors' | sort)

# flowkv showcase's case manifest and sweep file (the same target reads both)
cp "$root/tests/showcase/cases.json" "$out/fuzz_showcase/cases.json"
cp "$root/tests/showcase/sweep.json" "$out/fuzz_showcase/sweep.json"

# shard indexes
while IFS= read -r f; do
  cp "$f" "$out/fuzz_pipeline_index/$(seed_name "$f")"
done < <(find "$golden" -name model_index.json | sort)

while IFS= read -r f; do
  cp "$f" "$out/fuzz_shard_index/$(seed_name "$f")"
done < <(find "$golden" -name '*.safetensors.index.json' | sort)

# config.json of every family, to every config parser (each must refuse the others')
while IFS= read -r f; do
  cp "$f" "$out/fuzz_flux2_config/$(seed_name "$f")"
  cp "$f" "$out/fuzz_qwen_config/$(seed_name "$f")"
  cp "$f" "$out/fuzz_qwen3_config/$(seed_name "$f")"
  cp "$f" "$out/fuzz_flux2_vae_config/$(seed_name "$f")"
  cp "$f" "$out/fuzz_qwen3_vl_config/$(seed_name "$f")"
  cp "$f" "$out/fuzz_qwen21_vae_config/$(seed_name "$f")"
  cp "$f" "$out/fuzz_nucleus_config/$(seed_name "$f")"
done < <(find "$golden" -name config.json | sort)

# scheduler_config.json of the golden pipeline folders
while IFS= read -r f; do
  cp "$f" "$out/fuzz_scheduler_config/$(seed_name "$f")"
done < <(find "$golden" -name scheduler_config.json | sort)

# preprocessor_config.json (the Qwen3-VL image processor)
while IFS= read -r f; do
  cp "$f" "$out/fuzz_qwen3_vl_config/$(seed_name "$f")"
done < <(find "$golden" -name preprocessor_config.json | sort)

# transformer folders with one safetensors file, in fuzz_inspect_folder's layout:
# u16 config length, u32 data bytes left as a hole, u8 flags, config.json, safetensors header.
while IFS= read -r st; do
  dir=$(dirname "$st")
  [[ -f $dir/config.json ]] || continue
  n=$(header_len "$st")
  size=$(stat -c %s "$st")
  clen=$(stat -c %s "$dir/config.json")
  for flags in 0 1; do
    {
      le "$clen" 2
      le $((size - 8 - n)) 4
      le "$flags" 1
      cat "$dir/config.json"
      head -c $((8 + n)) "$st"
    } >"$out/fuzz_inspect_folder/$(seed_name "$dir")_flags$flags"
  done
done < <(find "$golden" -name diffusion_pytorch_model.safetensors | sort)

# GGUF files, whole (the reference files are small: tests/golden/gguf is ~28 KiB).
while IFS= read -r f; do
  cp "$f" "$out/fuzz_gguf/$(seed_name "$f")"
done < <(find "$golden" -name '*.gguf' | sort)

# Image files, whole (tests/golden/images/in; the two large Klein inputs left out).
while IFS= read -r f; do
  case $f in *.png) t=fuzz_png ;; *) t=fuzz_jpeg ;; esac
  cp "$f" "$out/$t/$(seed_name "$f")"
done < <(find "$golden/images/in" \( -name '*.png' -o -name '*.jpg' \) -size -40k | sort)
# Tokenizer: prompts (scripts, emoji, special-token text, CRLF, invalid UTF-8) and the tiny
# tokenizer.json (the Qwen3 one is 11 MB: too large a seed).
i=0
for p in 'a photo of a cat' $'naïve cafe\xcc\x81 \r\n\t  x' '猫 🐱 👨‍👩‍👧 🇯🇵 12345678' \
  "<|im_start|>user IT'S WE'LL<|im_end|><think>" $'\xff\xfe bad \xc3' 'مرحبا שָׁלוֹם नमस्ते สวัสดี'; do
  printf '%s' "$p" >"$out/fuzz_tokenizer/prompt$((i++))"
done
cp "$golden/tokenizer/tiny_tokenizer.json" "$out/fuzz_tokenizer_json/"
# Qwen2Tokenizer's files: vocab.json NUL merges.txt NUL tokenizer_config.json, of each tiny
# folder of tests/golden/tokenizer/qwen2_slow.
for d in "$golden"/tokenizer/qwen2_slow/*/; do
  { cat "$d/vocab.json"; printf '\0'; cat "$d/merges.txt"; printf '\0'; cat "$d/tokenizer_config.json"; } \
    >"$out/fuzz_qwen2_tokenizer_files/$(basename "$d")"
done
# Qwen3-VL: byte 0 even + a config.json; byte 0 odd + image count + grids + a prompt.
{ printf '\x00'; cat "$golden/qwen3_vl_text/text_encoder/config.json"; } >"$out/fuzz_qwen3_vl/config"
printf '\x01\x00a red fox' >"$out/fuzz_qwen3_vl/t2i"
printf '\x01\x02\x00\x02\x04\x01\x03\x02Put <image1> in <|im_start|>' >"$out/fuzz_qwen3_vl/ti2i"
printf '\x01\x01\x00\x02\x02a <|image_pad|> b' >"$out/fuzz_qwen3_vl/literal_pad"

# Reference store entry files (src/cache/ref_store_disk.cc's format, docs/reliability.md):
# "FLOWKVRS", u32 version 2, u32 header length, u8 kind length + kind, 32-byte digest, u32
# tensor count, per tensor u8 dtype-name length + name, u8 ndim, u64 dims; the header's
# HMAC-SHA256; zeros to a multiple of 64; each payload padded with zeros to a multiple of 64;
# the HMAC-SHA256 of everything before it. Sealed with fuzz_store_entry.cc's fixed secret (bytes
# 0..31); without the openssl command the MACs are zeros (the target reseals each input anyway).
fuzz_secret=$(printf '%02x' {0..31})
hexbytes() { printf "$(sed 's/../\\x&/g' <<<"$1")"; }  # hex digits -> bytes
pad64() {  # pad64 FILE: zeros up to a multiple of 64 bytes
  local n; n=$(stat -c %s "$1")
  head -c $(((64 - n % 64) % 64)) /dev/zero >>"$1"
}
mac_of() {  # mac_of FILE: the 32-byte HMAC of the file under the fuzz secret, on stdout
  if command -v openssl >/dev/null; then
    openssl dgst -sha256 -mac HMAC -macopt "hexkey:$fuzz_secret" -binary "$1"
  else
    head -c 32 /dev/zero
  fi
}
store_entry() {  # store_entry KIND DIGEST_HEX [DTYPE:D0,D1,...]...  (payload bytes 0x3f)
  local kind=$1 digest=$2 f body spec dt dims d x numel bytes
  shift 2
  f=$(mktemp) body=$(mktemp)
  {
    le ${#kind} 1; printf %s "$kind"; hexbytes "$digest"; le $# 4
    for spec in "$@"; do
      dt=${spec%%:*} dims=${spec#*:}
      IFS=, read -r -a d <<<"$dims"
      le ${#dt} 1; printf %s "$dt"; le ${#d[@]} 1
      for x in "${d[@]}"; do le "$x" 8; done
    done
  } >"$body"
  { printf FLOWKVRS; le 2 4; le $((16 + $(stat -c %s "$body"))) 4; cat "$body"; } >"$f"
  mac_of "$f" >"$body"
  cat "$body" >>"$f"
  pad64 "$f"
  for spec in "$@"; do
    dt=${spec%%:*} dims=${spec#*:} numel=1
    IFS=, read -r -a d <<<"$dims"
    for x in "${d[@]}"; do numel=$((numel * x)); done
    case $dt in F32) bytes=$((numel * 4)) ;; BF16 | F16) bytes=$((numel * 2)) ;;
      Q8_0) bytes=$((numel / 32 * 34)) ;; esac
    head -c "$bytes" /dev/zero | tr '\0' '\077' >>"$f"
    pad64 "$f"
  done
  mac_of "$f" >"$body"
  cat "$body" >>"$f"
  cat "$f"
  rm -f "$f" "$body"
}
zero_digest=$(printf '0%.0s' {1..64})
some_digest=0123456789abcdef00112233445566778899aabbccddeefff0e1d2c3b4a59687
store_entry kv "$zero_digest" F32:2,3,4 >"$out/fuzz_store_entry/kv_fixed_key"
store_entry kv "$some_digest" BF16:2,2,6,8 Q8_0:2,64 >"$out/fuzz_store_entry/kv_bf16_q8"
store_entry latents "$some_digest" F32:1,16,4,4 >"$out/fuzz_store_entry/latents"
store_entry prompt "$some_digest" F32:3,8 F16:3 F32: >"$out/fuzz_store_entry/prompt_scalar"
store_entry prompt "$zero_digest" >"$out/fuzz_store_entry/no_tensors"

for t in "${targets[@]}"; do
  echo "seeds: $t: $(find "$out/$t" -type f | wc -l) files, $(du -sk "$out/$t" | cut -f1) KiB"
done
