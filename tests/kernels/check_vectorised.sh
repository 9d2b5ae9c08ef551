#!/bin/sh
# Usage: check_vectorised.sh CXX SOURCE_ROOT [FLAGS...]
# Compiles tests/kernels/vec_probe.cc with the CPU kernels' flags (FLAGS: meson.build's
# kernels_cpp_args) and fails unless GCC vectorises every probe loop (4 loops, baseline and AVX2
# targets): a scalar fallback is otherwise silent, only 10x slower.
set -eu
cxx=$1
root=$2
shift 2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$cxx" -std=c++20 -O3 -march=x86-64-v2 -fopenmp "$@" -I"$root" \
  -c "$root/tests/kernels/vec_probe.cc" -o "$out/probe.o" -fopt-info-vec-all="$out/vec.txt"
missed=$(grep -c "couldn't vectorize loop" "$out/vec.txt" || true)
done_=$(grep -c "loop vectorized" "$out/vec.txt" || true)
echo "vec_probe.cc with flags '$*': $done_ vectorisation reports, $missed loops left scalar"
if [ "$missed" -ne 0 ] || [ "$done_" -lt 8 ]; then
  grep "couldn't vectorize\|not vectorized" "$out/vec.txt" | sort | uniq -c >&2 || true
  echo "FAIL: a vec_math.h loop does not vectorise with the kernels' flags" >&2
  exit 1
fi
echo "OK"
