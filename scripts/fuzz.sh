#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan, in build-fuzz/), replays the
# saved crash corpus tests/fuzz/regressions/<target>/, then fuzzes every target for a bounded
# time over seeds made from tests/golden. Exits non-zero on any crash, leak, timeout or OOM.
#   scripts/fuzz.sh [SECONDS_PER_TARGET]     (default 60; 0: build and replay regressions only)
# FLOWKV_FUZZ_TARGETS="fuzz_a fuzz_b" limits the run to those targets.
# A new crash is left in build-fuzz/crashes/<target>/; once understood, copy it, named for what
# it does, into tests/fuzz/regressions/<target>/ so that every later run replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET]" >&2; exit 2; }

source scripts/packages.sh
# The project's own dependencies (as scripts/setup.sh), clang, and its OpenMP runtime (CMake's
# FindOpenMP needs libomp under clang).
install_missing "${FLOWKV_PACKAGES[@]}" clang libomp-dev
# libFuzzer and the sanitizer runtimes ship in libclang-rt-<version>-dev from LLVM 14 on
# (a Recommends of clang, so absent where recommends are off).
if [[ $(clang++ -print-file-name=libclang_rt.fuzzer-x86_64.a) != /* ]]; then
  llvm_version=$(clang++ --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
  install_missing "libclang-rt-${llvm_version}-dev"
fi

t0=$SECONDS
cmake -S . -B build-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DFLOWKV_FUZZ=ON >/dev/null
mkdir -p build-fuzz/logs
if ! cmake --build build-fuzz --target fuzz_targets -j "${FLOWKV_BUILD_JOBS:-2}" \
  >build-fuzz/logs/build.log 2>&1; then
  tail -40 build-fuzz/logs/build.log >&2
  echo "fuzz: build failed (build-fuzz/logs/build.log)" >&2
  exit 1
fi
echo "fuzz: build took $((SECONDS - t0)) s"

read -r -a targets <<<"${FLOWKV_FUZZ_TARGETS:-fuzz_safetensors_header fuzz_shard_index fuzz_flux2_config fuzz_qwen_config \
  fuzz_inspect_folder fuzz_gguf fuzz_pipeline_index fuzz_png \
  fuzz_jpeg fuzz_tokenizer fuzz_tokenizer_json fuzz_qwen3_config \
  fuzz_flux2_vae_config fuzz_qwen3_vl fuzz_qwen3_vl_config fuzz_qwen21_vae_config \
  fuzz_store_entry fuzz_server_request}"
dict=tests/fuzz/json_safetensors.dict
tests/fuzz/make_seeds.sh build-fuzz/seeds >/dev/null

# halt_on_error: the first report ends the run (UBSan would otherwise print and go on).
export ASAN_OPTIONS=${ASAN_OPTIONS:-halt_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
common=(-rss_limit_mb=2048 -timeout=10)
failed=()

# 1. The saved crash corpus: every input must now pass.
crash_report() {  # the report in a log (sanitizer, harness, terminate), without runtime frames
  local report
  report=$(grep -E -A60 '^(==[0-9]+== ?ERROR|\*\*\*|terminate called|.*runtime error:)' "$1" |
    grep -vE ' in (fuzzer::|__sanitizer|__interceptor|raise|abort|__pthread_kill|std::terminate|__cxa_throw|__clang_call_terminate|main$)|^ +#[0-9]+ 0x[0-9a-f]+ +\(' || true)
  if [[ -n $report ]]; then head -30 <<<"$report" >&2; else tail -30 "$1" >&2; fi
}
for t in "${targets[@]}"; do
  mapfile -t saved < <(find "tests/fuzz/regressions/$t" -type f ! -name '.*' 2>/dev/null | sort)
  ((${#saved[@]})) || continue
  bad=0
  for f in "${saved[@]}"; do
    log=build-fuzz/logs/$t.regression.log
    if ! "build-fuzz/tests/fuzz/$t" "${common[@]}" "$f" >"$log" 2>&1; then
      echo "fuzz: $t: saved input $f fails again:" >&2
      crash_report "$log"
      bad=$((bad + 1))
    fi
  done
  echo "fuzz: $t: $((${#saved[@]} - bad))/${#saved[@]} saved regression inputs pass"
  ((bad == 0)) || failed+=("$t (regressions)")
done

# 2. Bounded fuzzing: each target for `seconds` on one core, as many at once as there are cores
# (FLOWKV_FUZZ_JOBS), so five one-minute targets take three minutes on two cores.
fuzz_one() {  # fuzz_one TARGET: runs it; its exit status and seconds go to logs/TARGET.rc
  local t=$1 start=$SECONDS rc=0
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/crashes/$t"
  (cd build-fuzz && exec "tests/fuzz/$t" "${common[@]}" -max_total_time="$seconds" \
    -dict="../$dict" -print_final_stats=1 -artifact_prefix="crashes/$t/" \
    "corpus/$t" "seeds/$t") >"build-fuzz/logs/$t.log" 2>&1 || rc=$?
  echo "$rc $((SECONDS - start))" >"build-fuzz/logs/$t.rc"
}
if ((seconds > 0)); then
  max_jobs=${FLOWKV_FUZZ_JOBS:-$(nproc)}
  for t in "${targets[@]}"; do
    rm -f "build-fuzz/logs/$t.rc"
    while (($(jobs -rp | wc -l) >= max_jobs)); do wait -n || true; done
    fuzz_one "$t" &
  done
  wait
  printf '%-26s %10s %8s %6s %6s  %s\n' target executions exec/s cov new result
  for t in "${targets[@]}"; do
    log=build-fuzz/logs/$t.log
    read -r rc took <"build-fuzz/logs/$t.rc"
    final_stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
    result="ok, $took s"
    if ((rc != 0)); then
      artifact=$(grep -oE "crashes/$t/[a-z-]+-[0-9a-f]+" "$log" | tail -1 || true)
      result="FAILED after $took s: build-fuzz/${artifact:-crashes/$t/} (log: $log)"
      failed+=("$t")
    fi
    printf '%-26s %10s %8s %6s %6s  %s\n' "$t" "$(final_stat number_of_executed_units)" \
      "$(final_stat average_exec_per_sec)" "${cov:--}" "$(final_stat new_units_added)" "$result"
  done
  for t in "${failed[@]}"; do
    [[ $t == *regressions* ]] && continue
    echo "--- $t:" >&2
    crash_report "build-fuzz/logs/$t.log"
  done
fi
# Scratch folders of targets that crashed (a target removes its own when it exits normally).
for d in /tmp/flowkv-fuzz-*-[0-9]*; do
  [[ -d $d ]] && ! kill -0 "${d##*-}" 2>/dev/null && rm -rf "$d"
done

echo "fuzz: took $((SECONDS - t0)) s in all"
if ((${#failed[@]})); then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
