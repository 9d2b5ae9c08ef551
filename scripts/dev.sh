#!/usr/bin/env bash
# accel developer entry point.
#   scripts/dev.sh demo    install what is missing, build, train the flagship example on real data
#   scripts/dev.sh test    install what is missing, build, run the whole test suite (meson test)
#   scripts/dev.sh build   install + configure + build only
#   scripts/dev.sh bench   build, then run build/bench/workloads all
# Environment: BUILD_DIR (default build), ACCEL_CUDA (auto|enabled|disabled, default auto),
#   ACCEL_PEERS=1 also installs libtorch (and OpenBLAS, without which Debian's libtorch falls back
#   to a reference BLAS 20x slower) so the bench can compare with it.
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
ACCEL_CUDA=${ACCEL_CUDA:-auto}

PACKAGES=(
  g++ meson ninja-build pkg-config cmake
  libdnnl-dev libeigen3-dev libgloo-dev zlib1g-dev
  doctest-dev libbenchmark-dev
  libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  libssl-dev
  libpng-dev libjpeg62-turbo-dev
  iptables
  dataset-fashion-mnist fortunes
  clang libclang-rt-dev
  clang-format
)

install_missing() {
  local missing=()
  local wanted=("${PACKAGES[@]}")
  if [ "${ACCEL_PEERS:-0}" = 1 ]; then
    wanted+=(libtorch-dev libopenblas0)
  fi
  for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "dev.sh: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

configure() {
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    meson setup "$BUILD_DIR" -Dcuda="$ACCEL_CUDA"
  fi
}

build() {
  install_missing
  configure
  ninja -C "$BUILD_DIR" -j"$(nproc)"
}

case "${1:-}" in
  demo)
    build
    shift
    exec "$BUILD_DIR/examples/fashion_mlp" "$@"
    ;;
  test)
    build
    shift
    meson test -C "$BUILD_DIR" --print-errorlogs --num-processes "$(nproc)" "$@"
    ;;
  build)
    build
    ;;
  bench)
    build
    shift
    exec "$BUILD_DIR/bench/workloads" "${@:-all}"
    ;;
  *)
    echo "usage: scripts/dev.sh demo|test|build|bench" >&2
    exit 2
    ;;
esac
