# ctest driver (cmake -P): install the build tree BUILD_DIR into WORK_DIR/prefix, configure and
# build the consumer project SOURCE_DIR against it, run it and check what it prints. With
# WITH_REFERENCE=ON the consumer also builds against lowbit::reference and lowbit::proptest.
# CXX_FLAGS and LINKER_FLAGS (optional) are the build's own, passed on to the consumer.
foreach(v BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR CXX)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_consumer_test.cmake: ${v} is not set")
  endif()
endforeach()

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
run("install" "${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK_DIR}/prefix")
set(configure_args -S "${SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    "-DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix" "-DCMAKE_CXX_COMPILER=${CXX}"
    -DCMAKE_BUILD_TYPE=Release "-DLOWBIT_CONSUMER_WITH_REFERENCE=${WITH_REFERENCE}"
    # The installed archives carry the build's instrumentation (the asan preset): so must the
    # consumer, or it cannot link them.
    "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" "-DCMAKE_EXE_LINKER_FLAGS=${LINKER_FLAGS}")
if(MAKE_PROGRAM)
  list(APPEND configure_args "-DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM}")
endif()
run("configure" "${CMAKE_COMMAND}" ${configure_args})
run("build" "${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run("run" "${WORK_DIR}/build/consumer")
message(STATUS "consumer printed:\n${last_output}")
# 1.5 = 1.1b x 2^0 -> 0x3C; 464 ties to the even max 448 (0x7E); 465 overflows to NaN (0x7F);
# -0 keeps its sign (0x80); verify finds the codes equal to those.
if(NOT last_output MATCHES "encode\\(e4m3fn, 1\\.5f, rne\\) = 0x3C\ncast\\(e4m3fn\\) = 0x3C 0x7E 0x7F 0x80\nverify: ok")
  message(FATAL_ERROR "unexpected consumer output:\n${last_output}")
endif()
if(WITH_REFERENCE)
  run("run consumer_reference" "${WORK_DIR}/build/consumer_reference")
  message(STATUS "consumer_reference printed:\n${last_output}")
  if(NOT last_output MATCHES "round\\(e4m3fn, 1\\.5, rne\\) = 0x3C\nmax_value\\(e5m2\\) = 57344\nproperty: passed")
    message(FATAL_ERROR "unexpected consumer_reference output:\n${last_output}")
  endif()
endif()
