# Sourced by scripts/sanitize.sh and scripts/fuzz.sh: the one sanitizer build both use.
#   san_build TARGET...   installs what it needs, configures build-san/ once, builds TARGETs
# build-san/: clang, ASan + UBSan, -O1 -g1 (line tables: file:line in reports, cheaper to
# compile than -g), FLOWKV_FUZZ=ON. The library is compiled once, with libFuzzer's coverage
# instrumentation, and linked into both the unit tests (sanitize.sh) and the fuzz targets
# (fuzz.sh), so when scripts/test.sh runs both, the second finds the library built and only
# compiles its own programs. Its build log: build-san/logs/build-<script>.log.
# FLOWKV_BUILD_JOBS: parallel compile jobs (default 2, CI's cores).
source scripts/packages.sh

san_dir=build-san

san_build() {
  local name log
  name=$(basename "$0" .sh)
  # The project's own dependencies (as scripts/setup.sh), clang, and its OpenMP runtime (CMake's
  # FindOpenMP needs libomp under clang).
  install_missing "${FLOWKV_PACKAGES[@]}" clang libomp-dev
  # libFuzzer and the sanitizer runtimes ship in libclang-rt-<version>-dev from LLVM 14 on
  # (a Recommends of clang, so absent where recommends are off).
  if [[ $(clang++ -print-file-name=libclang_rt.fuzzer-x86_64.a) != /* ]]; then
    local llvm_version
    llvm_version=$(clang++ --version | sed -n 's/.*clang version \([0-9]*\).*/\1/p' | head -1)
    install_missing "libclang-rt-${llvm_version}-dev"
  fi
  # Configured once; later builds re-run CMake themselves when a CMakeLists.txt changed.
  if [[ ! -f $san_dir/build.ninja ]]; then
    cmake -S . -B "$san_dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
      -DFLOWKV_FUZZ=ON >/dev/null
  fi
  mkdir -p "$san_dir/logs"
  log=$san_dir/logs/build-$name.log
  if ! cmake --build "$san_dir" --target "$@" -j "${FLOWKV_BUILD_JOBS:-2}" >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "$name: build failed ($log)" >&2
    return 1
  fi
}
