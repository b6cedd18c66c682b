// cuBLASLt for lowbit's GEMM backends: one handle per device, created on first use and kept for
// the process, the workspace size a matmul may use, and status checks that throw lowbit::error.
// Only CUDA builds compile this (kernels/gemm/gemm_cublaslt.cpp is its one user).
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <string>

namespace lowbit::kernels::cuda::blas {

// Throws lowbit::error (errc::device) naming the call unless status is CUBLAS_STATUS_SUCCESS.
void check(cublasStatus_t status, const char* what);

// The cuBLASLt handle of the current device (created once per device, thread-safe).
cublasLtHandle_t handle();

// Bytes of workspace each matmul gets. Each call takes its workspace from lowbit's stream-ordered
// scratch pool on the caller's stream instead of one buffer per device: two streams running
// matmuls at once would otherwise share (and race on) one workspace.
std::size_t workspace_bytes();

} // namespace lowbit::kernels::cuda::blas
