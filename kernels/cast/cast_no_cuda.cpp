// The cast's CUDA entry points in builds without CUDA (host API callers reach them only with
// device views, which such a build refuses).
#include "../common/no_cuda.hpp"
#include "cast_internal.hpp"

namespace lowbit::kernels::cuda {

void cast(const tensor_view&, const tensor_view&, const emu::format&, const emu::policy&,
          const emu::random_stream&, const exec&) {
  throw_no_cuda();
}
void decode(const tensor_view&, const tensor_view&, const emu::format&, const exec&) {
  throw_no_cuda();
}

} // namespace lowbit::kernels::cuda
