#!/usr/bin/env bash
# The installed tree works for a program outside this repository: `meson install` into a temporary
# DESTDIR, then tests/install/app/train_mlp.cc (an MLP trained with AdamW through accel.h) is built
# against that tree only, once with `pkg-config --cflags --libs accel` + c++ and once with CMake
# (find_package(accel) + accel::accel), and each binary must train (exit 0).
# Usage: test_install.sh MESON BUILD_DIR APP_DIR   (the `install` test; tests/install/meson.build)
# Exit 77 (skip) only when pkg-config or cmake is not installed, after the other half passed.
set -euo pipefail

meson=$1
build_dir=$(cd "$2" && pwd)
app_dir=$(cd "$3" && pwd)
cxx=c++  # the system compiler, as a user would (CMake picks its own default)

tmp=$(mktemp -d "${TMPDIR:-/tmp}/accel-install-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
destdir=$tmp/destdir

# Everything the build installs (library, headers, accel-run, accel.pc, the CMake package), built
# already: the test depends on the installed targets.
"$meson" install -C "$build_dir" --no-rebuild --quiet --destdir "$destdir" >"$tmp/install.log" 2>&1 || {
  cat "$tmp/install.log"
  echo "install: meson install --destdir failed"
  exit 1
}

# The configured prefix and libdir (meson's introspection; python3 is what meson runs on).
dirs=$(python3 - "$build_dir" <<'EOF'
import json, os, sys
opts = {o['name']: o['value'] for o in
        json.load(open(os.path.join(sys.argv[1], 'meson-info', 'intro-buildoptions.json')))}
print(opts['prefix'], os.path.join(opts['prefix'], opts['libdir']))
EOF
) || { echo "install: cannot read the prefix from $build_dir/meson-info"; exit 1; }
read -r prefix libdir <<<"$dirs"
root=$destdir$prefix
export LD_LIBRARY_PATH=$destdir$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

skipped=()

# 1. pkg-config + the compiler, as the README shows. The .pc file names paths under the real
# prefix: --define-variable points them at the DESTDIR copy (every path in it is ${prefix}-relative).
if command -v pkg-config >/dev/null; then
  export PKG_CONFIG_PATH=$destdir$libdir/pkgconfig
  flags=$(pkg-config --define-variable=prefix="$root" --cflags --libs accel)
  case "$flags" in
    *"$root"*) ;;
    *) echo "install: pkg-config --cflags --libs accel gave '$flags', which does not point into the install tree $root"; exit 1 ;;
  esac
  echo "install: $cxx -std=c++20 -Wall -Wextra -Werror train_mlp.cc $flags"
  # -Wall -Wextra -Werror: the public headers are warning-free in a user's build too.
  # shellcheck disable=SC2086  # the flags are words
  if ! "$cxx" -std=c++20 -O0 -Wall -Wextra -Werror "$app_dir/train_mlp.cc" $flags -o "$tmp/train_mlp_pc" >"$tmp/pc.log" 2>&1; then
    cat "$tmp/pc.log"
    echo "install: the out-of-tree program does not compile against the installed headers (pkg-config)"
    exit 1
  fi
  "$tmp/train_mlp_pc"
else
  skipped+=("pkg-config (Debian package pkg-config)")
fi

# 2. CMake: find_package(accel) from CMAKE_PREFIX_PATH, target accel::accel.
if command -v cmake >/dev/null; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  if ! cmake -S "$app_dir" -B "$tmp/cmake-build" "${generator[@]}" -DCMAKE_PREFIX_PATH="$root" \
      >"$tmp/cmake.log" 2>&1 ||
     ! cmake --build "$tmp/cmake-build" >>"$tmp/cmake.log" 2>&1; then
    cat "$tmp/cmake.log"
    echo "install: the out-of-tree program does not build with CMake's find_package(accel)"
    exit 1
  fi
  "$tmp/cmake-build/train_mlp"
else
  skipped+=("cmake (Debian package cmake)")
fi

if [ ${#skipped[@]} -gt 0 ]; then
  (IFS=,; echo "install: SKIP the part(s) needing ${skipped[*]}: not installed (scripts/dev.sh installs them)")
  exit 77
fi
echo "install: the installed tree builds and runs the program with pkg-config and with CMake"
