// Storage types of tensor elements. emu names them because a format's codes have one (see
// target.hpp's code_dtype): the kernels' tensor views and the Python module use the same enum.
#pragma once

#include <cstddef>
#include <cstdint>

#include <lowbit/emu/config.hpp>

namespace lowbit::emu {

enum class dtype : std::uint8_t {
  float32,
  float64,
  float16,
  bfloat16,
  uint8,
  int8,
  uint16,
  int16,
  uint32,
  int32,
  int64
};

LOWBIT_HD constexpr std::size_t dtype_size(dtype t) {
  switch (t) {
  case dtype::float64:
  case dtype::int64: return 8;
  case dtype::float32:
  case dtype::uint32:
  case dtype::int32: return 4;
  case dtype::float16:
  case dtype::bfloat16:
  case dtype::uint16:
  case dtype::int16: return 2;
  case dtype::uint8:
  case dtype::int8: return 1;
  }
  return 0;
}

} // namespace lowbit::emu
