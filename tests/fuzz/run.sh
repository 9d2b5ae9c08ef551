#!/usr/bin/env bash
# Builds the fuzz targets with clang + libFuzzer + ASan/UBSan and runs each for a bounded number
# of executions and seconds, seeded from tests/fuzz/corpus/<target>/ (docs/fuzzing.md).
#
#   run.sh <source root> <output dir> <target>:<source>,<source>... ...
#
# Only the few library sources each parser needs are compiled (with ninja, incrementally), not
# the whole library. Environment: FUZZ_RUNS (default 1000000) and FUZZ_SECONDS (default 12) bound
# each target's run; FUZZ_TARGETS="fuzz_idx fuzz_csv" runs only those; FUZZ_CXX picks the
# compiler; FUZZ_JOBS the compile parallelism (default 2). Exit 77 (skipped) without clang or
# libFuzzer, 1 when a target finds a crash (the input is kept in <output dir>/artifacts/).
set -uo pipefail

SRC=$(cd "$1" && pwd)
OUT=$2
shift 2
RUNS=${FUZZ_RUNS:-1000000}
SECONDS_PER_TARGET=${FUZZ_SECONDS:-12}
JOBS=${FUZZ_JOBS:-2}

CXX=${FUZZ_CXX:-}
if [ -z "$CXX" ]; then
  for c in clang++ clang++-14 clang++-15 clang++-16; do
    if command -v "$c" >/dev/null 2>&1; then CXX=$c; break; fi
  done
fi
if [ -z "$CXX" ]; then
  echo "fuzz: SKIP: no clang++ found (Debian: apt-get install clang libclang-rt-dev)"
  exit 77
fi
if ! command -v ninja >/dev/null 2>&1; then
  echo "fuzz: SKIP: ninja not found"
  exit 77
fi

mkdir -p "$OUT/obj" "$OUT/artifacts"
probe="$OUT/probe.cc"
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
  >"$probe"
if ! "$CXX" -fsanitize=fuzzer,address,undefined "$probe" -o "$OUT/probe" 2>"$OUT/probe.log"; then
  echo "fuzz: SKIP: $CXX cannot link -fsanitize=fuzzer (libFuzzer missing?" \
    "Debian: apt-get install libclang-rt-dev):"
  head -5 "$OUT/probe.log"
  exit 77
fi

# ---- build.ninja: one object per source, shared between targets ----
CXXFLAGS="-std=c++20 -g -O1 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined"
CXXFLAGS+=" -fno-sanitize-recover=all -I$SRC -I$SRC/tests/fuzz"
LDFLAGS="-fsanitize=fuzzer,address,undefined"
LIBS="-lyaml-cpp -lz -lcrypto -lpng16 -ljpeg -lpthread"
ninja_file="$OUT/build.ninja"
{
  echo "rule cxx"
  echo "  command = $CXX $CXXFLAGS -MMD -MF \$out.d -c \$in -o \$out"
  echo "  depfile = \$out.d"
  echo "  deps = gcc"
  echo "  description = clang \$in"
  echo "rule link"
  echo "  command = $CXX $LDFLAGS \$in -o \$out $LIBS"
  echo "  description = link \$out"
} >"$ninja_file"
declare -A seen_obj=()
targets=()
obj_of() { echo "obj/$(echo "$1" | tr '/' '_').o"; }
for spec in "$@"; do
  name=${spec%%:*}
  srcs=${spec#*:}
  if [ -n "${FUZZ_TARGETS:-}" ] && [[ " $FUZZ_TARGETS " != *" $name "* ]]; then continue; fi
  targets+=("$name")
  objs=()
  IFS=',' read -r -a src_list <<<"tests/fuzz/$name.cc,$srcs"
  for s in "${src_list[@]}"; do
    [ -z "$s" ] && continue
    o=$(obj_of "$s")
    if [ -z "${seen_obj[$o]:-}" ]; then
      echo "build $o: cxx $SRC/$s" >>"$ninja_file"
      seen_obj[$o]=1
    fi
    objs+=("$o")
  done
  echo "build $name: link ${objs[*]}" >>"$ninja_file"
done

start=$(date +%s)
if ! ninja -C "$OUT" -f build.ninja -j "$JOBS" "${targets[@]}"; then
  echo "fuzz: FAIL: building the targets with $CXX failed"
  exit 1
fi
echo "fuzz: built ${#targets[@]} targets with $CXX in $(($(date +%s) - start)) s"

# ---- run ----
failed=()
for name in "${targets[@]}"; do
  work="$OUT/corpus/$name"  # new inputs found in this run; the checked-in corpus stays as is
  rm -rf "$work"
  mkdir -p "$work"
  log="$OUT/$name.log"
  seeds="$SRC/tests/fuzz/corpus/$name"  # a target without seeds yet starts from scratch
  [ -d "$seeds" ] || seeds=""
  t0=$(date +%s)
  "$OUT/$name" -runs="$RUNS" -max_total_time="$SECONDS_PER_TARGET" -max_len=8192 \
    -rss_limit_mb=2048 -malloc_limit_mb=512 -timeout=30 -print_final_stats=1 \
    -artifact_prefix="$OUT/artifacts/$name-" "$work" ${seeds:+"$seeds"} >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  echo "fuzz: $name: rc $rc, ${execs:-?} executions in $(($(date +%s) - t0)) s"
  if [ $rc -ne 0 ]; then
    failed+=("$name")
    grep -E "ERROR|SUMMARY|runtime error|Test unit written|==ERROR" "$log" | head -20
    tail -30 "$log"
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: FAIL: ${failed[*]} (inputs in $OUT/artifacts; replay: <target> <input file>)"
  exit 1
fi
echo "fuzz: all ${#targets[@]} targets ran clean in $(($(date +%s) - start)) s"
