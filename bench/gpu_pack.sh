#!/usr/bin/env bash
# Packs what bench/gpu_check.sh runs, from a CUDA build made here, into one archive for a device
# machine that cannot build (its image has CUDA but not Debian's oneDNN, Gloo, yaml-cpp, ... and
# no package mirror): the check's programs and libaccel.so (stripped), a list of the tests, and
# every shared library they load that is neither the C/C++ runtime nor CUDA's (those the device
# has). On the device: bench/gpu_check.sh --prebuilt ARCHIVE (docs/cuda.md, "GPU check").
#   bench/gpu_pack.sh [BUILD_DIR [ARCHIVE]]    defaults: build-cuda, .gpu/pack.tar.xz
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build-cuda}
OUT=${2:-.gpu/pack.tar.xz}
[ -f "$BUILD/libaccel.so" ] || { echo "gpu_pack: no $BUILD/libaccel.so (build with -Dcuda=enabled)" >&2; exit 2; }
# name -> program, as `meson test` knows them (tests.list), and the programs the steps call.
TESTS="ops_cross_device kernels_cuda_vs_cpu comm_nccl"
PROGRAMS="tests/accelerate/accel_worker launcher/accel-run comm/tools/accel-selftest bench/gpu_bench"
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/syslib"
cp "$BUILD/libaccel.so" "$STAGE/" && strip --strip-unneeded "$STAGE/libaccel.so"
python3 - "$BUILD" $TESTS >"$STAGE/tests.list" <<'PY'
import json, os, subprocess, sys
build, wanted = sys.argv[1], set(sys.argv[2:])
for t in json.loads(subprocess.check_output(["meson", "introspect", build, "--tests"])):
    if t["name"] in wanted:
        print(t["name"], os.path.relpath(t["cmd"][0], build))
PY
progs=$PROGRAMS
while read -r _ path; do progs+=" $path"; done <"$STAGE/tests.list"
for p in $progs; do
  mkdir -p "$STAGE/$(dirname "$p")"
  cp "$BUILD/$p" "$STAGE/$p" && strip --strip-unneeded "$STAGE/$p"
done
# Libraries: what ldd resolves outside CUDA's folder, less the runtime every Linux has.
for f in "$STAGE/libaccel.so" $(for p in $progs; do echo "$BUILD/$p"; done); do ldd "$f"; done |
  awk '$3 ~ /^\// { print $3 }' | sort -u |
  grep -v -E '/usr/local/cuda|/libaccel\.so|/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$STAGE/syslib/"; done
mkdir -p "$(dirname "$OUT")"
tar -C "$STAGE" -cf - . | xz -T0 -6 >"$OUT"
echo "gpu_pack: $OUT ($(du -h "$OUT" | cut -f1)): $(wc -l <"$STAGE/tests.list") tests, $(ls "$STAGE/syslib" | wc -l) libraries: $(ls "$STAGE/syslib" | tr '\n' ' ')"
