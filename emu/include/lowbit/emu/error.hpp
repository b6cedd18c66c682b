// The one error type of lowbit. Host APIs throw it with a message that names the argument and
// what was expected; the Python module maps its kind to TypeError / ValueError / RuntimeError.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace lowbit {

enum class errc {
  invalid_argument, // a value out of its domain (unknown name, bad shape, NaN scale, ...)
  invalid_type,     // wrong dtype
  unsupported,      // valid, but not available in this build (no CUDA, ...)
  device,           // the CUDA runtime reported an error
};

class error : public std::runtime_error {
public:
  error(errc code, const std::string& what) : std::runtime_error(what), code_(code) {}
  errc code() const noexcept { return code_; }

private:
  errc code_;
};

// Throws error(code, what) unless cond holds. `what` is a message, or a function that returns
// one, called only when cond fails: checks on every call's hot path build no strings.
inline void require(bool cond, errc code, const char* what) {
  if (!cond)
    throw error(code, what);
}
inline void require(bool cond, errc code, const std::string& what) {
  if (!cond)
    throw error(code, what);
}
template <class Message, class = decltype(std::string(std::declval<Message&>()()))>
void require(bool cond, errc code, Message&& what) {
  if (!cond)
    throw error(code, what());
}

} // namespace lowbit
