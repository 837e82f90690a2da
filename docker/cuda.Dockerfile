# latchkey for NVIDIA GPUs: the worker with the NCCL backend (-DLATCHKEY_CUDA=ON) against the
# libtorch of a CUDA build of PyTorch, plus the coordinator and the CLI (same entrypoint,
# health check and user as docker/Dockerfile; docs/deploy.md).
#
#   docker build -f docker/cuda.Dockerfile -t latchkey:cuda \
#     --build-arg TORCH_VERSION=2.8.0 --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
#   podman build --format docker -f docker/cuda.Dockerfile -t latchkey:cuda .   (same arguments)
#
# It needs the network (the CUDA base image from a registry, Ubuntu's packages, the PyTorch
# wheel) and no GPU to build; a GPU node with the NVIDIA container toolkit to run. It has not
# been built where latchkey is developed (no registry, no GPU): docs/deploy.md. The base is
# Ubuntu 24.04 because NVIDIA publishes no Debian CUDA images: its gRPC 1.51, protobuf 3.21,
# abseil 20220623 and prometheus-cpp match Debian 12's. PyTorch >= 2.7's wheels use the C++11
# ABI, like the distribution's gRPC and abseil the project links. TORCH_VERSION and the CUDA of
# CUDA_TAG must agree (the wheel of cu128 on a 12.8 base).
ARG CUDA_TAG=12.8.1-cudnn-devel-ubuntu24.04
ARG CUDA_RUNTIME_TAG=12.8.1-cudnn-runtime-ubuntu24.04

FROM nvidia/cuda:${CUDA_TAG} AS build
ARG TORCH_VERSION=2.8.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ARG JOBS=4
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      build-essential cmake ninja-build pkg-config python3-venv libnccl-dev libnccl2 \
      libgloo-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libabsl-dev prometheus-cpp-dev libsqlite3-dev nlohmann-json3-dev libcli11-dev \
      libcpp-httplib-dev \
 && rm -rf /var/lib/apt/lists/*
# libtorch from the CUDA wheel (its share/cmake is what find_package(Torch) reads).
RUN python3 -m venv /opt/torch \
 && /opt/torch/bin/pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}"
WORKDIR /src
COPY CMakeLists.txt ./
COPY cmake cmake
COPY third_party third_party
COPY common common
COPY proto proto
COPY worker worker
COPY server server
COPY client client
COPY tests tests
COPY bench bench
COPY fuzz fuzz
RUN prefix=$(/opt/torch/bin/python -c 'import torch; print(torch.utils.cmake_prefix_path)') \
 && cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DLATCHKEY_BUILD_TESTS=OFF -DLATCHKEY_BUILD_BENCH=OFF -DLATCHKEY_CUDA=ON \
      -DLATCHKEY_WERROR=OFF -DCMAKE_PREFIX_PATH="$prefix" \
 && cmake --build /build -j"${JOBS}" --target latchkey-coordinator latchkey-worker latchkey_cli
COPY docker/list-runtime-packages.sh /usr/local/bin/
RUN mkdir -p /opt/latchkey/bin \
 && cp /build/server/latchkey-coordinator /build/worker/latchkey-worker /opt/latchkey/bin/ \
 && cp /build/client/latchkey /opt/latchkey/bin/latchkey \
 && strip --strip-debug /opt/latchkey/bin/* \
 && LD_LIBRARY_PATH=$(/opt/torch/bin/python -c 'import torch, os; print(os.path.dirname(torch.__file__) + "/lib")') \
      list-runtime-packages.sh /opt/latchkey/bin/* | grep -v '^libnccl\|^cuda-\|^libcu' \
      > /opt/latchkey/runtime-packages.txt

FROM nvidia/cuda:${CUDA_RUNTIME_TAG} AS runtime
ARG TORCH_VERSION=2.8.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
COPY --from=build /opt/latchkey/ /opt/latchkey/
# The same wheel as the build (its libtorch, cuDNN, NCCL and CUDA libraries), the distribution's
# libraries the binaries load, NCCL.
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      python3-venv libnccl2 $(cat /opt/latchkey/runtime-packages.txt) \
 && python3 -m venv /opt/torch \
 && /opt/torch/bin/pip install --no-cache-dir "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}" \
 && rm -rf /var/lib/apt/lists/* /root/.cache
COPY docker/entrypoint.sh docker/healthcheck.sh /usr/local/bin/
RUN sh -c 'echo "$(/opt/torch/bin/python -c "import torch, os; print(os.path.dirname(torch.__file__))")/lib" > /etc/ld.so.conf.d/torch.conf' \
 && ldconfig \
 && for bin in /opt/latchkey/bin/*; do ! ldd "$bin" | grep 'not found'; done \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/latchkey --create-home \
      --shell /usr/sbin/nologin latchkey \
 && mkdir -p /var/lib/latchkey /checkpoints /run/latchkey \
 && chown latchkey:latchkey /var/lib/latchkey /checkpoints /run/latchkey
USER 10001:10001
WORKDIR /var/lib/latchkey
ENV PATH=/opt/latchkey/bin:$PATH \
    LATCHKEY_PORT_FILE=/run/latchkey/ports.json \
    OMP_NUM_THREADS=1
EXPOSE 50051 9464 9400
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/usr/local/bin/healthcheck.sh"]
ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]
CMD ["--help"]
