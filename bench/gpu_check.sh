#!/usr/bin/env bash
# The prepared GPU check: on a machine with an NVIDIA GPU and CUDA in /usr/local/cuda, install
# what is missing, configure build-gpu with -Dcuda=enabled, build only what the GPU check runs,
# run the GPU tests, and print one table:
#   matmul through accel vs cuBLAS direct (bf16, 8192^3 and 1024^3), device copy GB/s,
#   the mlp / gpt workloads on the GPU, a GPT-2 124M-shape bf16 training step (context 1024).
# Every section is guarded: a missing or failing piece prints "n/a" and the script goes on.
# Budget: under 8 minutes on 16 cores (each step has its own timeout).
#   bench/gpu_check.sh                 BUILD_DIR=build-gpu JOBS=$(nproc) by default
set -uo pipefail
cd "$(dirname "$0")/.."

T0=$SECONDS
BUILD=${BUILD_DIR:-build-gpu}
JOBS=${JOBS:-$(nproc)}
export PATH=/usr/local/cuda/bin:$PATH
log() { printf '[gpu_check %3ds] %s\n' $((SECONDS - T0)) "$*"; }
row() { printf '| %-34s | %-18s | %-22s | %-8s |\n' "$1" "$2" "$3" "$4"; }

# ---- 0. the device ----
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || log "nvidia-smi failed"
else
  log "no nvidia-smi on PATH"
fi
log "nvcc: $(nvcc --version 2>/dev/null | tail -2 | head -1 || echo missing)"

# ---- 1. packages (Debian mirrors only; skipped when everything is there) ----
PKGS=(g++ meson ninja-build pkg-config python3 libdnnl-dev libeigen3-dev libgloo-dev zlib1g-dev doctest-dev
      libbenchmark-dev nlohmann-json3-dev libyaml-cpp-dev libcli11-dev libfmt-dev)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  if ! { timeout 120 $sudo apt-get update -qq &&
         DEBIAN_FRONTEND=noninteractive timeout 200 $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; }; then
    log "apt-get failed (no mirror reachable?); continuing with what is installed"
  fi
fi

# ---- 2. configure ----
if [ ! -f "$BUILD/build.ninja" ]; then
  if ! timeout 120 meson setup "$BUILD" -Dcuda=enabled -Dtests=true -Dbench=true -Dexamples=false \
      -Dbuildtype=release >"$BUILD.setup.log" 2>&1; then
    tail -30 "$BUILD.setup.log"
    log "configure failed; nothing to run"
    exit 1
  fi
fi
log "configured $BUILD"

# ---- 3. build what the check needs: the GPU tests (and what they depend on) and gpu_bench ----
GPU_TESTS=(cuda_vs_cpu dist_nccl)
mapfile -t TARGETS < <(python3 - "$BUILD" "${GPU_TESTS[@]}" <<'PY'
import json, os, subprocess, sys
build, wanted = sys.argv[1], set(sys.argv[2:])
tests = json.loads(subprocess.check_output(["meson", "introspect", build, "--tests"]))
targets = {t["id"]: t for t in json.loads(subprocess.check_output(["meson", "introspect", build, "--targets"]))}
out = set()
for t in tests:
    if t["name"] not in wanted:
        continue
    out.add(os.path.relpath(t["cmd"][0], build))
    for dep in t.get("depends", []):
        for f in targets.get(dep, {}).get("filename", []):
            out.add(os.path.relpath(f, build))
print("\n".join(sorted(out)))
PY
)
TARGETS+=(bench/gpu_bench)
log "building ${TARGETS[*]} with -j$JOBS"
if ! timeout 330 ninja -C "$BUILD" -j"$JOBS" "${TARGETS[@]}" >"$BUILD.build.log" 2>&1; then
  grep -E "error|FAILED" "$BUILD.build.log" | head -30
  log "build failed (log: $BUILD.build.log)"
fi
log "built"

# ---- 4. GPU tests ----
present=()
# --no-rebuild: a plain --list would build the whole project first.
ALL_TESTS=$(meson test -C "$BUILD" --no-rebuild --list 2>/dev/null)
for t in "${GPU_TESTS[@]}"; do
  grep -qx "$t" <<<"$ALL_TESTS" && present+=("$t")
done
TEST_STATUS="n/a"
if [ ${#present[@]} -gt 0 ]; then
  if timeout 300 meson test -C "$BUILD" --no-rebuild --print-errorlogs "${present[@]}"; then
    TEST_STATUS="pass"
  else
    TEST_STATUS="FAIL"
  fi
fi
log "GPU tests (${present[*]}): $TEST_STATUS"

# ---- 5. the table ----
echo
row "figure" "accel" "reference" "ratio"
row "----------------------------------" "------------------" "----------------------" "--------"
row "GPU tests: ${present[*]}" "$TEST_STATUS" "-" "-"
BENCH="$BUILD/bench/gpu_bench"
section() {  # name, timeout seconds
  if [ ! -x "$BENCH" ]; then
    row "$1" "n/a" "gpu_bench not built" "-"
    return
  fi
  timeout "$2" "$BENCH" "$1" 2>"$BUILD.bench.$1.err"
  local rc=$?
  if [ $rc -ne 0 ]; then
    row "$1" "n/a" "exit $rc" "-"
    tail -3 "$BUILD.bench.$1.err" | sed 's/^/    /'
  fi
}
section matmul 90
section copy 60
section mlp 90
section gpt 90
section gpt2 150
echo
log "done in $((SECONDS - T0)) s"
