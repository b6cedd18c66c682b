// A 2-D reading of a tensor view: leading dimensions collapse into rows, the last dimension is
// the row; rows may be strided (a slice of a wider matrix), elements within a row are contiguous.
// Every quantization granularity is defined on this reading (docs/techniques/quantization.md).
#pragma once

#include <cstdint>
#include <string>

#include <lowbit/kernels/tensor.hpp>

namespace lowbit::kernels {

struct matrix_shape {
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t row_stride = 0; // in elements
  bool contiguous() const { return row_stride == cols || rows <= 1; }
};

// Throws lowbit::error (naming `arg`) when the view cannot be read this way: the last dimension
// must have unit stride and the leading dimensions must collapse into one uniform row stride.
inline matrix_shape as_matrix(const tensor_view& v, const char* arg) {
  matrix_shape m;
  if (v.ndim == 0) {
    m.rows = 1;
    m.cols = 1;
    m.row_stride = 1;
    return m;
  }
  m.cols = v.shape[v.ndim - 1];
  m.rows = 1;
  for (int k = 0; k + 1 < v.ndim; ++k)
    m.rows *= v.shape[k];
  if (m.rows == 0 || m.cols == 0) {
    m.row_stride = m.cols;
    return m;
  }
  require(m.cols == 1 || v.strides[v.ndim - 1] == 1, errc::invalid_argument,
          [&] { return std::string(arg) + ": the last dimension must be contiguous (stride 1)"; });
  // Walk the leading dimensions from inner to outer (size-1 dimensions do not matter): the first
  // fixes the row stride, each further one must step over everything inside it.
  m.row_stride = m.cols;
  std::int64_t expect = -1;
  for (int k = v.ndim - 2; k >= 0; --k) {
    if (v.shape[k] == 1)
      continue;
    if (expect < 0) {
      m.row_stride = v.strides[k];
    } else {
      require(v.strides[k] == expect, errc::invalid_argument, [&] {
        return std::string(arg) + ": leading dimensions do not collapse into uniform rows; "
                                  "make the tensor contiguous first";
      });
    }
    expect = v.strides[k] * v.shape[k];
  }
  require(m.rows == 1 || m.row_stride >= m.cols, errc::invalid_argument, [&] {
    return std::string(arg) + ": rows overlap or run backwards (row stride " +
           std::to_string(m.row_stride) + " for rows of " + std::to_string(m.cols) + ")";
  });
  if (m.rows == 1)
    m.row_stride = m.cols;
  return m;
}

} // namespace lowbit::kernels
