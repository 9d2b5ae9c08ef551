#!/usr/bin/env bash
# The prepared GPU check (docs/cuda.md, "GPU check"): on a machine with NVIDIA GPUs and CUDA in
# /usr/local/cuda, in one call and under 8 minutes, build with CUDA and run
#   ops_cross_device     every op case of tests/ops/ on every device and dtype against the CPU
#   kernels_cuda_vs_cpu  what is CUDA-specific (allocator, streams, pinned memory, copies)
#   comm_nccl            the NCCL process group test (2 processes when 2 GPUs are visible)
#   nccl_world           accel-selftest --backend nccl, one rank per visible GPU, through accel-run
#   ddp_zero             the Accelerator's DDP and ZeRO 1/2/3 on the GPUs against one CPU process
#   matmul, gpt2         bf16 matmul vs cuBLAS; a GPT-2 124M bf16 training step with MFU
#   copy, mlp, gpt       device copy GB/s, the mlp and byte-GPT workloads on the GPU
# and print one table (step, status, figure). Logs go to $BUILD_DIR.check/<step>.log.
#
# Bounded: every step has its own time cap, and the caps are clipped to what is left of one
# budget for the whole run (GPU_CHECK_BUDGET, default 450 s); a step with under 5 s left is
# skipped and says so. Steps run in order of importance, so a slow build costs the extras first.
# ccache-friendly: meson picks up ccache when installed; the default buildtype is kept and
# CCACHE_BASEDIR makes the cache independent of the checkout's path.
#
#   bench/gpu_check.sh             run it (BUILD_DIR=build-gpu, JOBS=$(nproc), GPU_CHECK_BUDGET=450)
#   bench/gpu_check.sh --dry-run   print the steps, their caps and commands; run nothing
#   bench/gpu_check.sh --prebuilt ARCHIVE   no packages, configure or build: run the programs
#       bench/gpu_pack.sh packed from a CUDA build made elsewhere (a device image without
#       Debian's libraries and without a mirror), with the libraries it carries
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

DRY=0
PREBUILT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run|-n) DRY=1 ;;
    --prebuilt) PREBUILT=${2:?--prebuilt needs an archive}; shift ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
export PREBUILT

export DRY
export BUILD=${BUILD_DIR:-build-gpu}
export JOBS=${JOBS:-$(nproc)}
export LOG=${GPU_CHECK_LOG:-$BUILD.check}
BUDGET=${GPU_CHECK_BUDGET:-450}
export PATH=/usr/local/cuda/bin:$PATH
export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
T0=$SECONDS
exec 3>&1  # the terminal, for --dry-run's command lines (steps' own stdout goes to their log)

# ---- helpers (exported: each step runs in its own `timeout bash -c`) ----

# x CMD...: run CMD, or with --dry-run print it.
x() {
  if [ "$DRY" = 1 ]; then
    printf '      $' >&3
    printf ' %q' "$@" >&3
    printf '\n' >&3
    return 0
  fi
  "$@"
}
# put NAME STATUS FIGURE: one table row of the current step.
put() { [ "$DRY" = 1 ] || printf '%s|%s|%s\n' "$1" "$2" "$3" >>"$LOG/$STEP.row"; }
trim() {
  local s=$1
  s=${s#"${s%%[![:space:]]*}"}
  printf '%s' "${s%"${s##*[![:space:]]}"}"
}
# have_test NAME: a meson test of this build.
have_test() { grep -qx "$1" "$LOG/tests.list" 2>/dev/null; }
# mtest NAME: run one meson test; row with its status and doctest's counts.
mtest() {
  local name=$1 out="$LOG/$1.meson.txt"
  if [ "$DRY" != 1 ] && ! have_test "$name"; then
    put "$name" "absent" "not a test of this build (built with -Dcuda=enabled?)"
    return
  fi
  if [ -n "$PREBUILT" ]; then  # no meson build here: the test's program, as meson runs it
    local prog
    prog=$(awk -v n="$name" '$1 == n { print $2 }' "$BUILD/tests.list" 2>/dev/null)
    [ -n "$prog" ] || prog="($name's program from tests.list)"
    x "$BUILD/$prog" 2>&1 | tee "$out"
  else
    x meson test -C "$BUILD" --no-rebuild --print-errorlogs -v "$name" 2>&1 | tee "$out"
  fi
  local rc=${PIPESTATUS[0]}
  if [ -n "$PREBUILT" ] && [ "$rc" -eq 77 ]; then  # meson's skip code
    echo "Skipped: 1" >>"$out"
    rc=0
  fi
  [ "$DRY" = 1 ] && return
  local status=pass
  if [ $rc -ne 0 ]; then
    status=FAIL
  elif grep -Eq '^Skipped: +[1-9]' "$out"; then
    status=SKIP
  fi
  # doctest's summary lines, e.g. "[doctest] test cases: 3 | 3 passed | 0 failed | 0 skipped".
  local cases asserts
  cases=$(grep -E '^\[doctest\] test cases:' "$out" | tail -1 |
    sed 's/\[doctest\] test cases: *//; s/ *|.*//')
  asserts=$(grep -E '^\[doctest\] assertions:' "$out" | tail -1 |
    sed 's/\[doctest\] assertions: *//; s/ *|.*//')
  local fig="${cases:-?} test cases, ${asserts:-?} checks"
  # A runner of its own (ops_cross_device's program) prints one summary line "<name>: ...".
  [ -z "$cases" ] && fig=$(grep -E "^$name: " "$out" | tail -1 | cut -c1-160)
  [ -n "$fig" ] || fig="exit $rc"
  if [ "$status" = SKIP ]; then
    fig=$(grep -i 'skipped:' "$out" | grep -v '^Skipped:' | head -1 | cut -c1-90)
    [ -n "$fig" ] || fig="skipped (exit 77)"
  fi
  [ "$status" = FAIL ] && fig="$fig; $(grep -m1 -E 'ERROR|FAILED|error:' "$out" | cut -c1-90)"
  put "$name" "$status" "$fig"
}
# bench SECTION: one gpu_bench section; its rows "| name | ours | reference | ratio |" become
# figures.
bench() {
  local exe="$BUILD/bench/gpu_bench" out="$LOG/bench.$1.txt"
  if [ "$DRY" != 1 ] && [ ! -x "$exe" ]; then
    put "$1" "n/a" "bench/gpu_bench was not built"
    return
  fi
  x "$exe" "$1" 2>&1 | tee "$out"
  local rc=${PIPESTATUS[0]}
  [ "$DRY" = 1 ] && return
  local any=0 name ours ref ratio
  while IFS='|' read -r _ name ours ref ratio _; do
    name=$(trim "$name") ours=$(trim "$ours") ref=$(trim "$ref") ratio=$(trim "$ratio")
    [ -z "$name" ] && continue
    any=1
    if [ "$ours" = n/a ]; then
      put "$name" FAIL "${ref:0:90}"
    else
      put "$name" pass "$ours; $ref; $ratio"
    fi
  done < <(grep '^|' "$out")
  if [ $any = 0 ]; then
    put "$1" FAIL "exit $rc: $(tail -1 "$out" | cut -c1-80)"
  fi
}
export -f x put trim have_test mtest bench

# ---- steps (each may write rows with `put`; one that writes none gets pass/FAIL/TIMEOUT) ----

step_packages() {
  # Debian mirrors only; skipped when everything is there (a device machine may have no network).
  local pkgs=(g++ meson ninja-build pkg-config python3 ccache libdnnl-dev libeigen3-dev
              libgloo-dev zlib1g-dev doctest-dev libbenchmark-dev nlohmann-json3-dev
              libyaml-cpp-dev libcli11-dev libfmt-dev)
  local missing=() p
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    put packages pass "all installed"
    return
  fi
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  # Short network timeouts: offline, apt would otherwise retry for minutes.
  local opts=(-o Acquire::http::Timeout=10 -o Acquire::https::Timeout=10 -o Acquire::Retries=0)
  if x $sudo apt-get "${opts[@]}" update -qq &&
     x $sudo env DEBIAN_FRONTEND=noninteractive apt-get "${opts[@]}" install -y -qq \
       --no-install-recommends "${missing[@]}"; then
    put packages pass "installed ${missing[*]}"
  else
    put packages FAIL "could not install ${missing[*]} (offline?); going on with what is there"
  fi
}

step_configure() {
  if [ -f "$BUILD/build.ninja" ]; then
    # An existing build dir keeps its other options (and its ccache hits); CUDA is switched on.
    if x meson configure "$BUILD" -Dcuda=enabled -Dtests=true -Dbench=true; then
      put configure pass "$BUILD (existing), -Dcuda=enabled"
    else
      put configure FAIL "meson configure failed (log: $LOG/configure.log)"
      return 1
    fi
  elif x meson setup "$BUILD" -Dcuda=enabled -Dtests=true -Dbench=true -Dexamples=false; then
    put configure pass "$BUILD, -Dcuda=enabled"
  else
    put configure FAIL "meson setup failed (log: $LOG/configure.log)"
    return 1
  fi
  # `meson test --list` prints "project / name"; the rest of the script uses the bare names.
  [ "$DRY" = 1 ] ||
    meson test -C "$BUILD" --no-rebuild --list 2>/dev/null | sed 's|^.* / ||' >"$LOG/tests.list"
}

step_unpack() {
  # --prebuilt: the archive bench/gpu_pack.sh made replaces the build directory.
  rm -rf "$BUILD" && mkdir -p "$BUILD" && x tar -C "$BUILD" -xJf "$PREBUILT" || {
    put unpack FAIL "cannot unpack $PREBUILT"
    return 1
  }
  [ "$DRY" = 1 ] && return
  awk '{ print $1 }' "$BUILD/tests.list" >"$LOG/tests.list"
  put unpack pass "$PREBUILT: $(wc -l <"$LOG/tests.list") tests, $(ls "$BUILD/syslib" | wc -l) carried libraries; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
}

GPU_TESTS="ops_cross_device kernels_cuda_vs_cpu comm_nccl"
export GPU_TESTS
step_build() {
  # Only what the check runs: the GPU tests (with what they depend on), the DDP/ZeRO worker,
  # accel-run, accel-selftest and gpu_bench.
  local targets=()
  if [ "$DRY" = 1 ]; then
    echo "      (targets: the tests $GPU_TESTS and their depends, from meson introspect)" >&3
    targets=(tests/accelerate/accel_worker launcher/accel-run comm/tools/accel-selftest
             bench/gpu_bench)
  else
    mapfile -t targets < <(python3 - "$BUILD" $GPU_TESTS <<'PY'
import json, os, subprocess, sys
build, wanted = sys.argv[1], set(sys.argv[2:])
tests = json.loads(subprocess.check_output(["meson", "introspect", build, "--tests"]))
targets = json.loads(subprocess.check_output(["meson", "introspect", build, "--targets"]))
by_id = {t["id"]: t for t in targets}
extra = {"accel_worker", "accel-run", "accel-selftest", "gpu_bench"}
out = set()
for t in tests:
    if t["name"] in wanted:
        out.add(os.path.relpath(t["cmd"][0], build))
        for dep in t.get("depends", []):
            for f in by_id.get(dep, {}).get("filename", []):
                out.add(os.path.relpath(f, build))
for t in targets:
    if t["name"] in extra:
        out.update(os.path.relpath(f, build) for f in t["filename"])
print("\n".join(sorted(out)))
PY
    )
  fi
  local t=$SECONDS
  if x ninja -C "$BUILD" -j"$JOBS" "${targets[@]}"; then
    put build pass "${#targets[@]} targets in $((SECONDS - t)) s (-j$JOBS)"
  else
    put build FAIL "$(grep -m1 -E 'error' "$LOG/build.log" | cut -c1-90)"
  fi
}

step_ops_cross_device() { mtest ops_cross_device; }
step_kernels_cuda_vs_cpu() { mtest kernels_cuda_vs_cpu; }
step_comm_nccl() { mtest comm_nccl; }

step_nccl_world() {
  # One rank per visible GPU through the launcher; with one GPU a world of one (no traffic, the
  # checks still run every collective).
  local out="$LOG/nccl_world.txt"
  x "$BUILD/launcher/accel-run" launch --num_processes "$NGPU" --gpu_ids all \
    "$BUILD/comm/tools/accel-selftest" --backend nccl --timeout-ms 60000 --mib 256 >"$out" 2>&1
  local rc=$?
  [ "$DRY" = 1 ] && return
  local verdict bw
  verdict=$(grep -E -m1 '(PASS|FAIL): [0-9]+ of [0-9]+ checks' "$out" | sed 's/^\[rank0\]: //')
  bw=$(grep -m1 'info  all_reduce' "$out" | sed 's/^.*info  //')
  put "nccl_world ($NGPU GPU)" "$([ $rc -eq 0 ] && echo pass || echo FAIL)" \
    "${verdict:-exit $rc}${bw:+; $bw}"
}

step_ddp_zero() {
  # tests/accelerate/accel_worker ddp_mlp: an MLP through prepare() (AdamW, clipping, gradient
  # accumulation, 512-byte buckets) printing "norm"/"param" lines. The global batch is 16 for
  # every world size, so W GPUs (a power of two) must give one CPU process's numbers.
  local worker="$BUILD/tests/accelerate/accel_worker" w=1
  while [ $((w * 2)) -le "$NGPU" ] && [ $((w * 2)) -le 16 ]; do w=$((w * 2)); done
  x env ACCEL_USE_CPU=true "$worker" ddp_mlp 16 >"$LOG/ddp_cpu.txt" 2>&1 || {
    put ddp_zero FAIL "CPU reference run failed"
    return
  }
  local stage worst=0 failed=""
  for stage in 0 1 2 3; do
    local out="$LOG/ddp_gpu_zero$stage.txt"
    # accel-run's settings override the program's (ACCEL_* variables): give it the worker's.
    x "$BUILD/launcher/accel-run" launch --num_processes "$w" --gpu_ids all \
      --zero_stage "$stage" --gradient_accumulation_steps 2 --mixed_precision no \
      "$worker" ddp_mlp $((16 / w)) "$stage" >"$out" 2>&1
    local rc=$?
    [ "$DRY" = 1 ] && continue
    # Rank 0's lines against the CPU's: relative difference (absolute below 1e-6).
    local diff
    diff=$(awk '
      FNR == NR { if ($1 == "norm" || $1 == "param") ref[n++] = $2; next }
      { sub(/^\[rank0\]: /, "") }
      $1 == "norm" || $1 == "param" {
        d = $2 - ref[m++]; if (d < 0) d = -d
        s = ref[m - 1] < 0 ? -ref[m - 1] : ref[m - 1]; if (s < 1e-6) s = 1e-6
        if (d / s > worst) worst = d / s
      }
      END { if (m == 0 || m != n) print "count"; else printf "%.2g\n", worst }' \
      "$LOG/ddp_cpu.txt" <(grep -E '^(\[rank0\]: )?(norm|param) ' "$out"))
    if [ $rc -ne 0 ] || [ "$diff" = count ] || ! grep -q 'ok ddp_mlp' "$out"; then
      failed+=" zero$stage(exit $rc)"
    elif awk -v d="$diff" 'BEGIN { exit !(d > 1e-3) }'; then
      failed+=" zero$stage(rel $diff)"
    elif awk -v d="$diff" -v w="$worst" 'BEGIN { exit !(d > w) }'; then
      worst=$diff
    fi
  done
  [ "$DRY" = 1 ] && return
  local what="stages 0-3 on $w GPU(s) vs 1 CPU process, max rel diff $worst (bound 1e-3)"
  [ "$w" = 1 ] && what="$what; 1 GPU: no collectives, DDP/ZeRO need 2"
  if [ -n "$failed" ]; then
    put ddp_zero FAIL "failed:$failed; $what"
  else
    put ddp_zero pass "$what"
  fi
}

step_matmul() { bench matmul; }
step_gpt2() { bench gpt2; }
step_copy() { bench copy; }
step_mlp() { bench mlp; }
step_gpt() { bench gpt; }
mapfile -t step_functions < <(declare -F | awk '$3 ~ /^step_/ { print $3 }')
export -f "${step_functions[@]}"

# ---- the runner ----

ROWS=()
# run_step NAME CAP: run step_NAME under min(CAP, what is left of the budget).
run_step() {
  local name=$1 cap=$2
  export STEP=$name
  if [ "$DRY" = 1 ]; then
    printf '  %-20s cap %3d s\n' "$name" "$cap"
    "step_$name"
    return
  fi
  local left=$((BUDGET - (SECONDS - T0)))
  local t=$((cap < left ? cap : left))
  if [ "$t" -lt 5 ]; then
    ROWS+=("$name|skip|out of the ${BUDGET} s budget")
    return
  fi
  : >"$LOG/$name.row"
  printf '[gpu_check %3d s] %s (cap %d s)\n' $((SECONDS - T0)) "$name" "$t"
  timeout -k 10 "$t" bash -c "step_$name" >"$LOG/$name.log" 2>&1
  local rc=$?
  if [ -s "$LOG/$name.row" ]; then
    mapfile -t -O ${#ROWS[@]} ROWS <"$LOG/$name.row"
    [ $rc -eq 124 ] || [ $rc -eq 137 ] && ROWS+=("$name|TIMEOUT|stopped after $t s")
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    ROWS+=("$name|TIMEOUT|stopped after $t s (log: $LOG/$name.log)")
  else
    ROWS+=("$name|$([ $rc -eq 0 ] && echo pass || echo FAIL)|exit $rc")
  fi
  if grep -q '|\(FAIL\|TIMEOUT\)|' "$LOG/$name.row" 2>/dev/null || [ $rc -ne 0 ]; then
    tail -8 "$LOG/$name.log" | sed 's/^/    /'
  fi
}

if [ "$DRY" = 1 ]; then
  LOG=$(mktemp -d)  # the steps' redirections need a place; nothing is kept
  trap 'rm -rf "$LOG"' EXIT
fi
mkdir -p "$LOG"
rm -f "$LOG"/*.row
NGPU=0
GPU_DESC="no nvidia-smi"
if command -v nvidia-smi >/dev/null; then
  NGPU=$(timeout 20 nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  GPU_DESC=$(timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version \
    --format=csv,noheader 2>/dev/null | head -1)
fi
export NGPU
if [ -n "$PREBUILT" ]; then
  # The carried libraries, then CUDA's own wherever the image keeps them (cuDNN and NCCL may
  # come with a Python package rather than the toolkit).
  case "$PREBUILT" in /*) ;; *) PREBUILT=$PWD/$PREBUILT ;; esac
  case "$BUILD" in /*) ;; *) BUILD=$PWD/$BUILD ;; esac
  libdirs="$BUILD:$BUILD/syslib"
  for l in libcudart.so.13 libcublas.so.13 libcudnn.so.9 libnccl.so.2; do
    d=$(find /usr/local/cuda/lib64 /usr/local/cuda/targets /usr/lib /usr/local/lib /opt \
      -name "$l" 2>/dev/null | head -1)
    [ -n "$d" ] && libdirs+=":$(dirname "$d")"
  done
  export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
NVCC=$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo "no nvcc")

if [ "$DRY" = 1 ]; then
  echo "gpu_check --dry-run: $NGPU GPU(s) visible here; budget $BUDGET s; build dir $BUILD"
  NGPU=$((NGPU > 0 ? NGPU : 1))  # show the commands as a one-GPU machine would run them
fi
ROWS+=("device|$([ "$NGPU" -gt 0 ] && echo pass || echo FAIL)|$NGPU x ${GPU_DESC:-?}; nvcc $NVCC")

# Order of importance; each line: step, cap in seconds.
while read -r name cap; do
  if [ -n "$PREBUILT" ]; then
    case "$name" in packages | configure) continue ;; build) name=unpack ;; esac
  fi
  run_step "$name" "$cap"
  # Nothing can run without a configured build.
  if [ "$DRY" != 1 ] && [ "$name" = configure ] && [ ! -f "$BUILD/build.ninja" ]; then
    ROWS+=("remaining steps|skip|no build")
    break
  fi
  if [ "$DRY" != 1 ] && [ "$name" = unpack ] && [ ! -f "$BUILD/tests.list" ]; then
    ROWS+=("remaining steps|skip|nothing unpacked")
    break
  fi
done <<'STEPS'
packages 45
configure 90
build 300
ops_cross_device 150
kernels_cuda_vs_cpu 90
comm_nccl 90
nccl_world 60
ddp_zero 120
matmul 60
gpt2 120
copy 30
mlp 40
gpt 40
STEPS

[ "$DRY" = 1 ] && exit 0

echo
printf '| %-40s | %-7s | %s\n' "step" "status" "figure"
printf '| %-40s | %-7s | %s\n' "----------------------------------------" "-------" "------"
fails=0
for r in "${ROWS[@]}"; do
  IFS='|' read -r name status figure <<<"$r"
  printf '| %-40s | %-7s | %s\n' "$name" "$status" "$figure"
  case "$status" in FAIL|TIMEOUT) fails=$((fails + 1)) ;; esac
done
echo
echo "gpu_check: $((SECONDS - T0)) s, $fails step(s) failed or timed out; logs in $LOG/"
[ "$fails" -eq 0 ]
