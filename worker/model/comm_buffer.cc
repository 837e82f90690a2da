#include "worker/model/comm_buffer.h"

#include <c10/util/Exception.h>

namespace latchkey {

comm::Buffer CommBuffer(const at::Tensor& t) {
  TORCH_CHECK(t.is_contiguous(), "collective buffer must be contiguous");
  comm::Buffer b;
  switch (t.scalar_type()) {
    case at::kFloat:
      b.type = comm::DataType::kFloat32;
      break;
    case at::kDouble:
      b.type = comm::DataType::kFloat64;
      break;
    case at::kBFloat16:
      b.type = comm::DataType::kBFloat16;
      break;
    case at::kByte:
      b.type = comm::DataType::kUInt8;
      break;
    default:
      TORCH_CHECK(false, "no collective data type for ", t.scalar_type());
  }
  if (t.is_cuda()) {
    b.device = comm::Device::Cuda(t.device().index());
  } else {
    TORCH_CHECK(t.is_cpu(), "collective buffer on unsupported device ", t.device());
    b.device = comm::Device::Cpu();
  }
  b.data = t.data_ptr();
  b.count = static_cast<size_t>(t.numel());
  return b;
}

}  // namespace latchkey
