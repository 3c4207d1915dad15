#!/usr/bin/env bash
# llama.cpp's source for the peer rows, trimmed to what a build, a conversion and a quantization need
# (28 MB: CPU and CUDA backends only; the GPU machine has no network, so it travels: run's carry):
#   bash benchmarks/peers/fetch_llama_cpp.sh        -> benchmarks/peers/llama.cpp/ (git-ignored)
# From the llama-cpp-python sdist (it vendors llama.cpp with gguf-py and convert_hf_to_gguf.py).
set -euo pipefail
VERSION=${LLAMA_CPP_PYTHON:-0.3.36}
here=$(cd "$(dirname "$0")" && pwd)
dest="$here/llama.cpp"
[ -f "$dest/CMakeLists.txt" ] && { echo "$dest is there"; exit 0; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q "llama-cpp-python==$VERSION" --no-deps --no-binary :all: -d "$tmp"
tar xzf "$tmp"/llama_cpp_python-"$VERSION".tar.gz -C "$tmp"
src="$tmp/llama_cpp_python-$VERSION/vendor/llama.cpp"
rm -rf "$src"/{models,docs,media,benches,app,pocs,.github,tools/ui,tests,examples}   # web UI, tests, examples: not built
for b in cann et hexagon metal opencl openvino sycl virtgpu vulkan webgpu; do rm -rf "$src/ggml/src/ggml-$b"; done
rm -rf "$dest" && mv "$src" "$dest"
echo "llama.cpp from llama-cpp-python $VERSION in $dest ($(du -sh "$dest" | cut -f1))"
