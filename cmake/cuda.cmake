# Decides LOWBIT_WITH_CUDA from LOWBIT_ENABLE_CUDA and enables the CUDA language when on.
#
# AUTO builds the kernels for the GPUs that nvidia-smi sees, and none where it sees no GPU (a
# CPU-only machine gets the CPU library in minutes, not the kernels for three GPU generations),
# unless CMAKE_CUDA_ARCHITECTURES names architectures: then they are built whatever the machine.
# ON builds them always (for 75, 80 and 90 unless CMAKE_CUDA_ARCHITECTURES says otherwise).
set(LOWBIT_WITH_CUDA OFF)
if(LOWBIT_ENABLE_CUDA STREQUAL "AUTO" AND NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  find_program(LOWBIT_NVIDIA_SMI nvidia-smi)
  set(lowbit_gpu_caps "")
  if(LOWBIT_NVIDIA_SMI)
    execute_process(COMMAND "${LOWBIT_NVIDIA_SMI}" --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE lowbit_gpu_caps RESULT_VARIABLE lowbit_smi_rc ERROR_QUIET
                    TIMEOUT 20)
    if(NOT lowbit_smi_rc EQUAL 0)
      set(lowbit_gpu_caps "")
    endif()
  endif()
  string(REGEX MATCHALL "[0-9]+\\.[0-9]+" lowbit_gpu_caps "${lowbit_gpu_caps}")
  if(lowbit_gpu_caps)
    list(TRANSFORM lowbit_gpu_caps REPLACE "\\." "")
    list(REMOVE_DUPLICATES lowbit_gpu_caps)
    set(CMAKE_CUDA_ARCHITECTURES "${lowbit_gpu_caps}")
    message(STATUS "lowbit: GPU seen (sm_${lowbit_gpu_caps}): CUDA kernels for it alone")
  else()
    set(LOWBIT_ENABLE_CUDA OFF)
    message(STATUS "lowbit: no GPU seen: the CPU library alone (LOWBIT_ENABLE_CUDA=ON or "
                   "CMAKE_CUDA_ARCHITECTURES builds the CUDA kernels)")
  endif()
endif()
if(LOWBIT_ENABLE_CUDA STREQUAL "ON" OR LOWBIT_ENABLE_CUDA STREQUAL "AUTO")
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(LOWBIT_WITH_CUDA ON)
  elseif(LOWBIT_ENABLE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LOWBIT_ENABLE_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
if(LOWBIT_WITH_CUDA)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 75 80 90)
  endif()
  enable_language(CUDA)
  # CMake 3.25 predates nvcc's C++20 support; teach it the flag (newer CMake knows it already).
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION OR CMAKE_CUDA20_STANDARD_COMPILE_OPTION STREQUAL "")
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
endif()
message(STATUS "lowbit: CUDA kernels ${LOWBIT_WITH_CUDA} (LOWBIT_ENABLE_CUDA=${LOWBIT_ENABLE_CUDA})")
