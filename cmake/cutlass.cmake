# Work in progress: the CUTLASS sm_90 kernels of kernels/gemm.
function(lowbit_gemm_cutlass tgt)
  target_sources(${tgt} PRIVATE ${PROJECT_SOURCE_DIR}/kernels/gemm/gemm_cutlass_none.cpp)
endfunction()
