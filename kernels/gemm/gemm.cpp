// Work in progress: filled in by the GEMM layer commits.
#include "gemm_internal.hpp"
