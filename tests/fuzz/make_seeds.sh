#!/usr/bin/env bash
# Writes the fuzz targets' seed corpora from tests/golden into OUT_DIR/<target>/ (nothing large
# is committed: safetensors seeds are the files' headers only, their data becomes a hole).
#   tests/fuzz/make_seeds.sh OUT_DIR
set -euo pipefail
out=${1:?usage: make_seeds.sh OUT_DIR}
root="$(cd "$(dirname "$0")/../.." && pwd)"
golden="$root/tests/golden"

targets=(fuzz_safetensors_header fuzz_shard_index fuzz_flux2_config fuzz_qwen_config
         fuzz_inspect_folder fuzz_gguf fuzz_flux2_vae_config)
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

# shard indexes
while IFS= read -r f; do
  cp "$f" "$out/fuzz_shard_index/$(seed_name "$f")"
done < <(find "$golden" -name '*.safetensors.index.json' | sort)

# config.json of every family, to both config parsers (each must refuse the other's)
while IFS= read -r f; do
  cp "$f" "$out/fuzz_flux2_config/$(seed_name "$f")"
  cp "$f" "$out/fuzz_qwen_config/$(seed_name "$f")"
  cp "$f" "$out/fuzz_flux2_vae_config/$(seed_name "$f")"
done < <(find "$golden" -name config.json | sort)

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

for t in "${targets[@]}"; do
  echo "seeds: $t: $(find "$out/$t" -type f | wc -l) files, $(du -sk "$out/$t" | cut -f1) KiB"
done
