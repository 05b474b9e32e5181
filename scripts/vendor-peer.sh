#!/usr/bin/env bash
# Packs llama.cpp's source for a side-by-side run on a GPU machine without a network
# (bench/cuda/peer_device.sh): the llama-cpp-python sdist from PyPI carries it as
# vendor/llama.cpp. What the CUDA build of llama-bench does not need (models, docs, other
# backends, the server and its UI) is left out, so the archive travels with the tree:
#   .peer/llamacpp.tar.xz   about 3 MB (the sdist is 77 MB)
#   .peer/VERSION           the sdist it came from
# Usage: scripts/vendor-peer.sh [VERSION]   (default: the version below, pinned so that figures
# from different sessions compare the same peer)
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-0.3.36}
out=.peer
if [ -f "$out/llamacpp.tar.xz" ] && [ "$(cat "$out/VERSION" 2>/dev/null)" = "llama-cpp-python $version" ]; then
  echo "$out/llamacpp.tar.xz is present (llama-cpp-python $version)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --no-binary :all: -d "$tmp" "llama-cpp-python==$version"
tar -xzf "$tmp"/llama_cpp_python-"$version".tar.gz -C "$tmp"
src="$tmp/llama_cpp_python-$version/vendor/llama.cpp"
[ -f "$src/CMakeLists.txt" ] || { echo "error: no vendor/llama.cpp in llama-cpp-python $version" >&2; exit 1; }
rm -rf "$src"/{models,docs,media,gguf-py,conversion,benches,scripts,.github} \
  "$src"/ggml/src/{ggml-et,ggml-metal,ggml-hexagon,ggml-sycl,ggml-vulkan,ggml-opencl,ggml-cann,ggml-musa,ggml-webgpu,ggml-zdnn} \
  "$src"/tools/{ui,server,mtmd,tts}
# Only llama-bench among the tools (the others' folders may be gone).
echo 'add_subdirectory(llama-bench)' >"$src/tools/CMakeLists.txt"
mkdir -p "$out"
tar -cJf "$out/llamacpp.tar.xz" -C "$(dirname "$src")" llama.cpp
echo "llama-cpp-python $version" >"$out/VERSION"
echo "$out/llamacpp.tar.xz ready: $(du -h "$out/llamacpp.tar.xz" | cut -f1) (llama-cpp-python $version)"
