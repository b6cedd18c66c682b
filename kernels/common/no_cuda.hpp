// Builds without CUDA: each technique's stand-ins for its CUDA entry points (<technique>/
// <technique>_no_cuda.cpp) refuse device views through this one error.
#pragma once

namespace lowbit::kernels {

// Throws lowbit::error (errc::unsupported): this build has no CUDA kernels.
[[noreturn]] void throw_no_cuda();

} // namespace lowbit::kernels
