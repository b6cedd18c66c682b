// Numbers, bit patterns and indices as text for the verify reports, the policy texts and the
// error messages (internal to lowbit::verify).
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace lowbit::verify::detail {

inline constexpr double inf = std::numeric_limits<double>::infinity();
inline constexpr double nan = std::numeric_limits<double>::quiet_NaN();

// The shortest text that reads back as the same double.
std::string shortest(double x);
// For people: a value that a float holds exactly prints as the shortest float text (0.1f as
// "0.1", not "0.10000000149011612"); the hex bit pattern beside it removes any doubt.
std::string readable(double x);
// Errors to six significant digits: enough to read, and the JSON form keeps every digit.
std::string error_text(double x);
// "0x" and `digits` upper-case hex digits of bits.
std::string hex(std::uint64_t bits, int digits);
std::string index_text(const std::vector<std::int64_t>& index); // "[1, 2]"
std::string shape_text(const std::vector<std::int64_t>& shape); // "(3,)", "(2, 3)"

} // namespace lowbit::verify::detail
