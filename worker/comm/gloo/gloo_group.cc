#include "worker/comm/gloo/gloo_group.h"

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/context.h>
#include <gloo/math.h>

#include <chrono>
#include <cstring>
#include <vector>

namespace latchkey::comm {
namespace {

template <typename T>
void SetSum(gloo::AllreduceOptions& opts) {
  opts.setReduceFunction(
      static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
}

class GlooGroup final : public Group {
 public:
  GlooGroup(std::string name, std::shared_ptr<gloo::Context> ctx,
            std::shared_ptr<CollectiveStats> stats)
      : Group(std::move(name), ctx->rank, ctx->size, Device::Cpu(), std::move(stats)),
        ctx_(std::move(ctx)) {}

 protected:
  // Gloo moves host memory only: its groups are CPU groups (Group::CheckDevice).
  const char* backend() const override { return "gloo"; }

  absl::Status DoAllReduceSum(const Buffer& data, std::chrono::milliseconds timeout) override {
    return Guard(timeout, [&] {
      gloo::AllreduceOptions opts(ctx_);
      opts.setTimeout(timeout);
      if (data.type == DataType::kFloat32) {
        opts.setOutput(static_cast<float*>(data.data), data.count);
        SetSum<float>(opts);
      } else {
        opts.setOutput(static_cast<double*>(data.data), data.count);
        SetSum<double>(opts);
      }
      gloo::allreduce(opts);
    });
  }

  absl::Status DoAllGather(const Buffer& in, const Buffer& out,
                           std::chrono::milliseconds timeout) override {
    return Guard(timeout, [&] {
      gloo::AllgatherOptions opts(ctx_);
      opts.setTimeout(timeout);
      const bool in_place =
          static_cast<const char*>(in.data) ==
          static_cast<const char*>(out.data) + static_cast<size_t>(rank()) * in.bytes();
      // gloo's in-place form: no input buffer, this rank's chunk already sits in `out`.
      if (in.type == DataType::kFloat32) {
        SetGather<float>(opts, in, out, in_place);
      } else if (in.type == DataType::kBFloat16) {
        SetGather<uint16_t>(opts, in, out, in_place);
      } else if (in.type == DataType::kUInt8) {
        SetGather<uint8_t>(opts, in, out, in_place);
      } else {
        SetGather<double>(opts, in, out, in_place);
      }
      gloo::allgather(opts);
    });
  }

  // Ring reduce-scatter over unbound buffers: size-1 steps; at step s this rank sends its partial
  // sum of chunk (r-s-1) to the next rank and adds the previous rank's partial of chunk (r-s-2);
  // after the last step it holds the full sum of chunk r.
  absl::Status DoReduceScatterSum(const Buffer& in, const Buffer& out,
                                  std::chrono::milliseconds timeout) override {
    return Guard(timeout, [&] {
      const int n = size();
      const int r = rank();
      const size_t count = out.count;
      const size_t chunk_bytes = out.bytes();
      char* const in_bytes = static_cast<char*>(in.data);
      // In place when `out` is this rank's chunk of `in`: reduce inside `in` itself.
      const bool in_place = static_cast<char*>(out.data) == in_bytes + r * chunk_bytes;
      std::vector<char> copy;
      if (!in_place) copy.assign(in_bytes, in_bytes + chunk_bytes * n);
      char* work = in_place ? in_bytes : copy.data();
      std::vector<char> incoming(chunk_bytes);
      auto send_buf = ctx_->createUnboundBuffer(work, chunk_bytes * n);
      auto recv_buf = ctx_->createUnboundBuffer(incoming.data(), incoming.size());
      const int next = (r + 1) % n;
      const int prev = (r - 1 + n) % n;
      const uint64_t slot = ctx_->nextSlot();
      for (int s = 0; s < n - 1; ++s) {
        const int send_chunk = ((r - s - 1) % n + n) % n;
        const int recv_chunk = ((r - s - 2) % n + n) % n;
        send_buf->send(next, slot, send_chunk * chunk_bytes, chunk_bytes);
        recv_buf->recv(prev, slot, 0, chunk_bytes);
        recv_buf->waitRecv(timeout);
        send_buf->waitSend(timeout);
        char* dst = work + recv_chunk * chunk_bytes;
        if (in.type == DataType::kFloat32) {
          Add(reinterpret_cast<float*>(dst), reinterpret_cast<const float*>(incoming.data()),
              count);
        } else {
          Add(reinterpret_cast<double*>(dst), reinterpret_cast<const double*>(incoming.data()),
              count);
        }
      }
      if (!in_place) std::memcpy(out.data, work + r * chunk_bytes, chunk_bytes);
    });
  }

  absl::Status DoBroadcast(const Buffer& data, int root,
                           std::chrono::milliseconds timeout) override {
    return Guard(timeout, [&] {
      gloo::BroadcastOptions opts(ctx_);
      opts.setTimeout(timeout);
      opts.setRoot(root);
      if (data.type == DataType::kFloat32) {
        opts.setOutput(static_cast<float*>(data.data), data.count);
      } else if (data.type == DataType::kBFloat16) {
        opts.setOutput(static_cast<uint16_t*>(data.data), data.count);
      } else if (data.type == DataType::kUInt8) {
        opts.setOutput(static_cast<uint8_t*>(data.data), data.count);
      } else {
        opts.setOutput(static_cast<double*>(data.data), data.count);
      }
      gloo::broadcast(opts);
    });
  }

  absl::Status DoBarrier(std::chrono::milliseconds timeout) override {
    return Guard(timeout, [&] {
      gloo::BarrierOptions opts(ctx_);
      opts.setTimeout(timeout);
      gloo::barrier(opts);
    });
  }

 private:
  template <typename T>
  static void SetGather(gloo::AllgatherOptions& opts, const Buffer& in, const Buffer& out,
                        bool in_place) {
    if (!in_place) opts.setInput(static_cast<T*>(in.data), in.count);
    opts.setOutput(static_cast<T*>(out.data), out.count);
  }

  template <typename T>
  static void Add(T* dst, const T* src, size_t n) {
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
  }

  // Gloo reports timeouts and peer failures alike as gloo::IoException; they become a Status
  // here, by meaning. An exception raised once the call's deadline has passed is the deadline
  // (DEADLINE_EXCEEDED: a peer is slow or stuck); one raised before it means the connection
  // broke (UNAVAILABLE: a peer vanished). Anything else escaping gloo is a bug (INTERNAL).
  template <typename Fn>
  static absl::Status Guard(std::chrono::milliseconds timeout, Fn&& fn) {
    const auto start = std::chrono::steady_clock::now();
    try {
      fn();
      return absl::OkStatus();
    } catch (const gloo::IoException& e) {
      if (DeadlineReached(std::chrono::steady_clock::now() - start, timeout)) {
        return absl::DeadlineExceededError("no progress within " + std::to_string(timeout.count()) +
                                           " ms: " + e.what());
      }
      return absl::UnavailableError(std::string("peer connection lost: ") + e.what());
    } catch (const std::exception& e) {
      return absl::InternalError(e.what());
    }
  }

  std::shared_ptr<gloo::Context> ctx_;
};

}  // namespace

std::shared_ptr<Group> MakeGlooGroup(std::string name, std::shared_ptr<gloo::Context> ctx,
                                     std::shared_ptr<CollectiveStats> stats) {
  return std::make_shared<GlooGroup>(std::move(name), std::move(ctx), std::move(stats));
}

}  // namespace latchkey::comm
