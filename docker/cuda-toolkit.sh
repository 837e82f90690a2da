#!/bin/bash
# Runs in the GPU image's build stage: turns the CUDA wheels in the virtual environment VENV
# (nvidia/cu13 holds nvcc, the headers and the libraries) into the toolkit layout CMake's
# FindCUDAToolkit and PyTorch's CMake files expect, at /opt/cuda: lib64, the unversioned .so
# names a link needs, and lib64/stubs/libcuda.so, an empty stand-in for the driver library
# (PyTorch's CMake names CUDA::cuda_driver; nothing the binaries call is in it, so the link
# records no dependency on it and the real driver library is the one found at run time).
# It also drops the protobuf 3.13 headers and protoc the torch wheel carries (torch/include/google,
# torch/bin/protoc): libtorch's headers need neither, and the build uses Debian's protobuf 3.21,
# whose generated code must not meet the older headers through libtorch's include folder.
set -euo pipefail
venv=${1:?usage: cuda-toolkit.sh VENV}
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cu=$site/nvidia/cu13
[ -x "$cu/bin/nvcc" ] || { echo "cuda-toolkit: no nvcc in $cu" >&2; exit 1; }
[ -e "$cu/lib64" ] || ln -s lib "$cu/lib64"
for lib in "$cu"/lib/lib*.so.*; do
  dev=$(sed 's/\(\.so\)\..*/\1/' <<<"$lib")
  [ -e "$dev" ] || ln -s "$(basename "$lib")" "$dev"
done
mkdir -p "$cu/lib/stubs"
: > /tmp/libcuda-stub.c
gcc -shared -Wl,-soname,libcuda.so.1 -o "$cu/lib/stubs/libcuda.so" /tmp/libcuda-stub.c
rm /tmp/libcuda-stub.c
ln -sfn "$cu" /opt/cuda
rm -rf "$site/torch/include/google" "$site/torch/bin/protoc"*
# NCCL and cuDNN keep their own folders.
for pkg in nccl cudnn; do
  for lib in "$site/nvidia/$pkg"/lib/lib*.so.*; do
    dev=$(sed 's/\(\.so\)\..*/\1/' <<<"$lib")
    [ -e "$dev" ] || ln -s "$(basename "$lib")" "$dev"
  done
done
"$cu/bin/nvcc" --version | tail -2
