// CPU execution helpers for the CPU twins: a blocking parallel-for over index ranges and a cursor
// over strided views. Work is split into contiguous chunks whose boundaries are multiples of 64,
// so chunking never changes results (per-element work depends on the logical index only).
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

#include <lowbit/kernels/tensor.hpp>

namespace lowbit::kernels::cpu {

// The machine's hardware threads, asked once per process: on Linux each
// std::thread::hardware_concurrency() reads /sys/devices/system/cpu/online (an open, a read and a
// close: about a third of a small CPU call's time).
inline int hardware_threads() {
  static const int n = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return n;
}

inline int thread_count(int requested, std::int64_t n, std::int64_t grain = 1 << 16) {
  const int t = requested > 0 ? requested : hardware_threads();
  const std::int64_t by_work = std::max<std::int64_t>(1, n / grain);
  return static_cast<int>(std::min<std::int64_t>(t, by_work));
}

// Calls fn(begin, end) over [0, n) split across `threads` threads; rethrows the first exception.
template <class Fn>
void parallel_for(std::int64_t n, int threads, Fn&& fn, std::int64_t grain = 1 << 16) {
  if (n <= 0)
    return;
  const int t = thread_count(threads, n, grain);
  if (t <= 1) {
    fn(std::int64_t{0}, n);
    return;
  }
  const std::int64_t chunk = ((n + t - 1) / t + 63) / 64 * 64;
  std::vector<std::thread> pool;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(t));
  for (int k = 0; k < t; ++k) {
    const std::int64_t b = k * chunk, e = std::min(n, b + chunk);
    if (b >= e)
      break;
    pool.emplace_back([&, k, b, e] {
      try {
        fn(b, e);
      } catch (...) {
        errors[static_cast<std::size_t>(k)] = std::current_exception();
      }
    });
  }
  for (auto& th : pool)
    th.join();
  for (auto& ex : errors)
    if (ex)
      std::rethrow_exception(ex);
}

// Walks the elements of a view in row-major logical order from a starting index, yielding the
// element offset (in elements) of each.
class cursor {
public:
  cursor(const tensor_view& v, std::int64_t start) : v_(v) {
    std::int64_t rest = start;
    for (int k = v.ndim - 1; k >= 0; --k) {
      const std::int64_t ext = v.shape[k] > 0 ? v.shape[k] : 1;
      idx_[k] = rest % ext;
      rest /= ext;
      offset_ += idx_[k] * v.strides[k];
    }
  }
  std::int64_t offset() const { return offset_; }
  void next() {
    for (int k = v_.ndim - 1; k >= 0; --k) {
      offset_ += v_.strides[k];
      if (++idx_[k] < v_.shape[k])
        return;
      offset_ -= idx_[k] * v_.strides[k];
      idx_[k] = 0;
    }
  }

private:
  const tensor_view& v_;
  std::int64_t idx_[max_dims] = {};
  std::int64_t offset_ = 0;
};

// Calls fn(i, a_offset, b_offset) for logical indices [begin, end) of two same-shape views.
template <class Fn>
void for_each_pair(const tensor_view& a, const tensor_view& b, std::int64_t begin, std::int64_t end,
                   Fn&& fn) {
  cursor ca(a, begin), cb(b, begin);
  for (std::int64_t i = begin; i < end; ++i, ca.next(), cb.next())
    fn(i, ca.offset(), cb.offset());
}

} // namespace lowbit::kernels::cpu
