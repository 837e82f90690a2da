# latchkey for NVIDIA GPUs: the coordinator, the worker with the NCCL backend
# (-DLATCHKEY_CUDA=ON) against the libtorch of PyTorch's CUDA build, and the CLI; the same
# entrypoint, health check and unprivileged user (uid 10001) as docker/Dockerfile.
#
#   scripts/image.sh --cuda      (podman + buildah, no registry or GPU needed; smoke-tests it)
#   podman build --format docker --isolation chroot --ignorefile docker/Dockerfile.dockerignore \
#     -f docker/cuda.Dockerfile -t latchkey:cuda .
#   docker build -f docker/cuda.Dockerfile -t latchkey:cuda .
#
# The base is Debian 12, as the CPU image's: Debian's gRPC, protobuf, abseil, prometheus-cpp,
# libgloo and the other dev packages; PyTorch's CUDA wheel from PyPI, whose libtorch (built
# with the C++11 ABI, like Debian's gRPC and abseil) is what find_package(Torch) reads; CUDA's
# compiler and headers and NCCL from PyPI's NVIDIA wheels. Every version is pinned in
# docker/cuda-requirements.txt. The build needs no GPU; running on a GPU needs a driver that
# supports the CUDA major version pinned there (docs/deploy.md).
#
# Stages: `build` compiles the binaries; `runtime` (the default target) holds them, the
# packages owning the shared libraries they load (derived with ldd and dpkg, as in the CPU
# image) and the wheels' shared libraries (libtorch, CUDA, cuDNN, NCCL) at the paths their
# RUNPATHs name, without Python, headers or the compiler.
FROM debian:bookworm-slim AS build
ARG JOBS=2
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      build-essential cmake ninja-build pkg-config python3-venv \
      libgloo-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
      libabsl-dev prometheus-cpp-dev libsqlite3-dev nlohmann-json3-dev libcli11-dev \
      libcpp-httplib-dev \
 && rm -rf /var/lib/apt/lists/*
# The wheels (~4 GB installed) before the sources, so a source change reuses these layers.
# PIP_CERT: a CA bundle for pip (scripts/image.sh mounts the host's, for a TLS-intercepting
# proxy the host trusts); empty: the image's own.
ARG PIP_CERT=""
COPY docker/cuda-requirements.txt /opt/latchkey-build/
RUN python3 -m venv /opt/torch \
 && /opt/torch/bin/pip install --no-cache-dir --disable-pip-version-check ${PIP_CERT:+--cert "$PIP_CERT"} \
      -r /opt/latchkey-build/cuda-requirements.txt
COPY docker/cuda-toolkit.sh /opt/latchkey-build/
RUN /opt/latchkey-build/cuda-toolkit.sh /opt/torch
ENV PATH=/opt/cuda/bin:$PATH \
    TORCH_CUDA_ARCH_LIST=9.0
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
RUN site=$(/opt/torch/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
 && cmake -S /src -B /build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DLATCHKEY_BUILD_TESTS=OFF -DLATCHKEY_BUILD_BENCH=OFF -DLATCHKEY_CUDA=ON \
      -DLATCHKEY_WERROR=OFF -DCMAKE_PREFIX_PATH="$site/torch/share/cmake;$site/torch" \
      -DCUDAToolkit_ROOT=/opt/cuda -DCUDA_TOOLKIT_ROOT_DIR=/opt/cuda \
      -DCMAKE_CUDA_COMPILER=/opt/cuda/bin/nvcc -DProtobuf_PROTOC_EXECUTABLE=/usr/bin/protoc \
      -DLATCHKEY_NCCL_INCLUDE_DIR="$site/nvidia/nccl/include" \
      -DLATCHKEY_NCCL_LIBRARY="$site/nvidia/nccl/lib/libnccl.so.2"
RUN cmake --build /build -j"${JOBS}" --target latchkey-coordinator latchkey-worker latchkey_cli
# The NCCL self-test (docs/gpu.md), in its own layer so the compile above stays cached.
RUN cmake --build /build -j"${JOBS}" --target latchkey-nccl-check
COPY docker/list-runtime-packages.sh /usr/local/bin/
# /opt/bundle: what the runtime stage takes, at the same paths: the binaries and their package
# list, the wheels' shared libraries (no stub, no static library) and the loader's search path.
RUN site=$(/opt/torch/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
 && mkdir -p /opt/bundle/opt/latchkey/bin /opt/bundle/etc/ld.so.conf.d \
 && cp /build/server/latchkey-coordinator /build/worker/latchkey-worker \
      /opt/bundle/opt/latchkey/bin/ \
 && cp /build/client/latchkey /opt/bundle/opt/latchkey/bin/latchkey \
 && cp /build/worker/comm/nccl/latchkey-nccl-check /opt/bundle/opt/latchkey/bin/ \
 && strip --strip-debug /opt/bundle/opt/latchkey/bin/* \
 && (cd / && find "${site#/}/torch/lib" "${site#/}/nvidia" \( -name '*.so' -o -name '*.so.*' \) \
        ! -path '*/stubs/*' -print | tar -cf - -T - | tar -xf - -C /opt/bundle) \
 && (cd /opt/bundle && find "${site#/}" -name '*.so*' -printf '/%h\n' | sort -u) \
      > /opt/bundle/etc/ld.so.conf.d/latchkey-cuda.conf \
 && LATCHKEY_BUNDLED_LIBS="$site:/opt/cuda:/opt/torch" \
      list-runtime-packages.sh /opt/bundle/opt/latchkey/bin/* \
      > /opt/bundle/opt/latchkey/runtime-packages.txt \
 && du -sh /opt/bundle
# The GPU check runs in this stage on a GPU machine, against the bundle's binaries: the same
# files the runtime stage ships (docs/deploy.md "The GPU check in the image").
COPY scripts/gpu-check.sh scripts/gpu_check_report.py scripts/
COPY testdata testdata

# The runtime: the same layout as docker/Dockerfile's runtime stages.
FROM debian:bookworm-slim AS runtime
COPY docker/entrypoint.sh docker/healthcheck.sh docker/install-runtime.sh /usr/local/bin/
RUN useradd --system --uid 10001 --user-group --home-dir /var/lib/latchkey --create-home \
      --shell /usr/sbin/nologin latchkey \
 && mkdir -p /var/lib/latchkey /checkpoints /run/latchkey \
 && chown latchkey:latchkey /var/lib/latchkey /checkpoints /run/latchkey
# BUILD_STAGE_ID: the build stage's image id (scripts/image.sh passes it). podman 4's layer
# cache keys `COPY --from` by its text alone, so without it new binaries would meet an old
# cached copy.
ARG BUILD_STAGE_ID=""
RUN echo "build stage ${BUILD_STAGE_ID:-unknown}" > /opt/latchkey-build-stage
COPY --from=build /opt/bundle/ /
RUN ldconfig && install-runtime.sh --no-blas
WORKDIR /var/lib/latchkey
ENV PATH=/opt/latchkey/bin:$PATH \
    LATCHKEY_PORT_FILE=/run/latchkey/ports.json \
    OMP_NUM_THREADS=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
# gRPC and the coordinator's HTTP (metrics) port; the worker's metrics port.
EXPOSE 50051 9464 9400
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/usr/local/bin/healthcheck.sh"]
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/entrypoint.sh"]
CMD ["--help"]
