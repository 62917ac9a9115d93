#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz in build-san/ (scripts/san_build.sh: clang, ASan +
# UBSan, the build scripts/sanitize.sh shares, so after it only the targets themselves compile),
# replays the saved crash corpus tests/fuzz/regressions/<target>/, then fuzzes every target for a
# bounded time over seeds made from tests/golden. Exits non-zero on any crash, leak, timeout or OOM.
#   scripts/fuzz.sh [SECONDS_PER_TARGET]     (default 60; 0: build and replay regressions only)
# The targets are those of tests/fuzz/CMakeLists.txt (FLOWKV_FUZZ_TARGETS, the one list);
# FLOWKV_FUZZ_TARGETS="fuzz_a fuzz_b" in the environment limits the run to those targets.
# A new crash is left in build-san/crashes/<target>/; once understood, copy it, named for what
# it does, into tests/fuzz/regressions/<target>/ so that every later run replays it.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
[[ $seconds =~ ^[0-9]+$ ]] || { echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET]" >&2; exit 2; }
source scripts/san_build.sh

t0=$SECONDS
san_build fuzz_targets
echo "fuzz: build took $((SECONDS - t0)) s"

if [[ -n ${FLOWKV_FUZZ_TARGETS:-} ]]; then
  read -r -a targets <<<"$FLOWKV_FUZZ_TARGETS"
else
  mapfile -t targets <"$san_dir/tests/fuzz/targets.txt"
fi
dict=tests/fuzz/json_safetensors.dict
tests/fuzz/make_seeds.sh "$san_dir/seeds" >/dev/null

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
    log=$san_dir/logs/$t.regression.log
    if ! "$san_dir/tests/fuzz/$t" "${common[@]}" "$f" >"$log" 2>&1; then
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
  # (a target without seeds in make_seeds.sh starts from an empty corpus)
  mkdir -p "$san_dir/corpus/$t" "$san_dir/crashes/$t" "$san_dir/seeds/$t"
  (cd "$san_dir" && exec "tests/fuzz/$t" "${common[@]}" -max_total_time="$seconds" \
    -dict="../$dict" -print_final_stats=1 -artifact_prefix="crashes/$t/" \
    "corpus/$t" "seeds/$t") >"$san_dir/logs/$t.log" 2>&1 || rc=$?
  echo "$rc $((SECONDS - start))" >"$san_dir/logs/$t.rc"
}
if ((seconds > 0)); then
  max_jobs=${FLOWKV_FUZZ_JOBS:-$(nproc)}
  for t in "${targets[@]}"; do
    rm -f "$san_dir/logs/$t.rc"
    while (($(jobs -rp | wc -l) >= max_jobs)); do wait -n || true; done
    fuzz_one "$t" &
  done
  wait
  printf '%-26s %10s %8s %6s %6s  %s\n' target executions exec/s cov new result
  for t in "${targets[@]}"; do
    log=$san_dir/logs/$t.log
    read -r rc took <"$san_dir/logs/$t.rc"
    final_stat() { sed -n "s/^stat::$1: *//p" "$log" | tail -1; }
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | cut -d' ' -f2)
    result="ok, $took s"
    if ((rc != 0)); then
      artifact=$(grep -oE "crashes/$t/[a-z-]+-[0-9a-f]+" "$log" | tail -1 || true)
      result="FAILED after $took s: $san_dir/${artifact:-crashes/$t/} (log: $log)"
      failed+=("$t")
    fi
    printf '%-26s %10s %8s %6s %6s  %s\n' "$t" "$(final_stat number_of_executed_units)" \
      "$(final_stat average_exec_per_sec)" "${cov:--}" "$(final_stat new_units_added)" "$result"
  done
  for t in "${failed[@]}"; do
    [[ $t == *regressions* ]] && continue
    echo "--- $t:" >&2
    crash_report "$san_dir/logs/$t.log"
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
