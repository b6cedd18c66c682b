# The CUTLASS sm_90 kernels of kernels/gemm (gemm_cutlass_sm90*.cu), or their stand-in
# (gemm_cutlass_none.cpp) where CUTLASS's headers are missing or sm_90 is not among the CUDA
# architectures. CUTLASS is header-only and never vendored: its headers come from
# LOWBIT_CUTLASS_INCLUDE_DIR, else from PyPI's nvidia-cutlass wheel (cutlass_library/source/include)
# in the interpreter the build uses, else from the system's include directories.
#
# The kernels use WGMMA and TMA, which exist only in the architecture-specific target sm_90a: the
# files are compiled for 90a alone, in an object library whose objects join lowbit_kernels (so the
# installed and exported lowbit::kernels is one library, as without CUTLASS). Each operand pair's
# kernels are a translation unit of their own (a few minutes of nvcc each), so they build in
# parallel.

set(LOWBIT_CUTLASS_INCLUDE_DIR "" CACHE PATH
    "Directory holding cutlass/cutlass.h and cute/tensor.hpp (empty: search for them)")

# Prints the include directory of the nvidia-cutlass wheel installed for `python`, or nothing.
function(lowbit_cutlass_from_python python out)
  set(${out} "" PARENT_SCOPE)
  if(NOT python)
    return()
  endif()
  # find_spec locates the package without importing it (its import pulls in CUDA's Python
  # bindings, which need not work on a build machine).
  execute_process(
    COMMAND "${python}" -c
            "import importlib.util as u, os; s = u.find_spec('cutlass_library'); print(os.path.join(os.path.dirname(s.origin), 'source', 'include') if s and s.origin else '')"
    OUTPUT_VARIABLE dir OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET TIMEOUT 30)
  if(rc EQUAL 0 AND dir AND EXISTS "${dir}/cutlass/cutlass.h")
    set(${out} "${dir}" PARENT_SCOPE)
  endif()
endfunction()

# True when CMAKE_CUDA_ARCHITECTURES includes sm_90 in any spelling (90, 90a, 90-real, ...).
function(lowbit_cuda_archs_include_90 out)
  set(${out} OFF PARENT_SCOPE)
  foreach(arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
    if(arch MATCHES "^90[a-z]?(-real|-virtual)?$" OR arch STREQUAL "all" OR arch STREQUAL "all-major")
      set(${out} ON PARENT_SCOPE)
    endif()
  endforeach()
endfunction()

function(lowbit_find_cutlass out)
  set(${out} "" PARENT_SCOPE)
  set(candidates "")
  if(LOWBIT_CUTLASS_INCLUDE_DIR)
    if(NOT EXISTS "${LOWBIT_CUTLASS_INCLUDE_DIR}/cutlass/cutlass.h"
       OR NOT EXISTS "${LOWBIT_CUTLASS_INCLUDE_DIR}/cute/tensor.hpp")
      message(FATAL_ERROR "LOWBIT_CUTLASS_INCLUDE_DIR=${LOWBIT_CUTLASS_INCLUDE_DIR} holds no "
                          "cutlass/cutlass.h and cute/tensor.hpp")
    endif()
    set(${out} "${LOWBIT_CUTLASS_INCLUDE_DIR}" PARENT_SCOPE)
    return()
  endif()
  # The repository's virtual environment (scripts/setup.sh) first, then the interpreter CMake finds.
  set(python "")
  if(EXISTS "${PROJECT_SOURCE_DIR}/.venv/bin/python")
    set(python "${PROJECT_SOURCE_DIR}/.venv/bin/python")
  else()
    find_package(Python3 COMPONENTS Interpreter QUIET)
    if(Python3_Interpreter_FOUND)
      set(python "${Python3_EXECUTABLE}")
    endif()
  endif()
  lowbit_cutlass_from_python("${python}" dir)
  if(dir AND EXISTS "${dir}/cute/tensor.hpp")
    set(${out} "${dir}" PARENT_SCOPE)
    return()
  endif()
  # Debian and hand-installed copies.
  foreach(dir /usr/include /usr/local/include /usr/local/cuda/include)
    if(EXISTS "${dir}/cutlass/cutlass.h" AND EXISTS "${dir}/cute/tensor.hpp")
      set(${out} "${dir}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
endfunction()

function(lowbit_gemm_cutlass tgt)
  lowbit_cuda_archs_include_90(with_90)
  set(cutlass_dir "")
  if(with_90)
    lowbit_find_cutlass(cutlass_dir)
  endif()
  if(NOT with_90 OR NOT cutlass_dir)
    target_sources(${tgt} PRIVATE ${PROJECT_SOURCE_DIR}/kernels/gemm/gemm_cutlass_none.cpp)
    if(NOT with_90)
      message(STATUS "lowbit: CUTLASS sm_90 GEMM kernels off (90 is not in "
                     "CMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES})")
    else()
      message(STATUS "lowbit: CUTLASS sm_90 GEMM kernels off (no CUTLASS headers: "
                     "pip install nvidia-cutlass, or set LOWBIT_CUTLASS_INCLUDE_DIR)")
    endif()
    return()
  endif()

  set(gemm "${PROJECT_SOURCE_DIR}/kernels/gemm")
  add_library(lowbit_gemm_cutlass_sm90 OBJECT
    ${gemm}/gemm_cutlass_sm90.cu # the refusal checks and the dispatch
    ${gemm}/gemm_cutlass_sm90_int8.cu
    ${gemm}/gemm_cutlass_sm90_bf16.cu
    ${gemm}/gemm_cutlass_sm90_f16.cu
    ${gemm}/gemm_cutlass_sm90_e4m3.cu
    ${gemm}/gemm_cutlass_sm90_e5m2_e4m3.cu)
  set_target_properties(lowbit_gemm_cutlass_sm90 PROPERTIES
    CUDA_ARCHITECTURES 90a POSITION_INDEPENDENT_CODE ON CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
  # SYSTEM: CUTLASS's own warnings are not ours to fix.
  target_include_directories(lowbit_gemm_cutlass_sm90 SYSTEM PRIVATE "${cutlass_dir}")
  target_include_directories(lowbit_gemm_cutlass_sm90 PRIVATE ${PROJECT_SOURCE_DIR}/kernels/include)
  # emu's headers and the CUDA runtime's (an object library takes usage requirements only; the
  # objects are linked into ${tgt}, which links both).
  target_link_libraries(lowbit_gemm_cutlass_sm90 PRIVATE lowbit::emu CUDA::cudart)
  target_compile_definitions(lowbit_gemm_cutlass_sm90 PRIVATE LOWBIT_WITH_CUDA=1
                             LOWBIT_WITH_CUTLASS_SM90=1)
  # The kernels' flags (kernels/CMakeLists.txt): the epilogue must stay separate float operations
  # (no contraction into FMA) to match the CPU twin bit for bit.
  target_compile_options(lowbit_gemm_cutlass_sm90 PRIVATE
    --expt-relaxed-constexpr -lineinfo --fmad=false -Xcompiler=-ffp-contract=off)
  target_sources(${tgt} PRIVATE $<TARGET_OBJECTS:lowbit_gemm_cutlass_sm90>)
  message(STATUS "lowbit: CUTLASS sm_90 GEMM kernels on (sm_90a; headers in ${cutlass_dir})")
endfunction()
