// The verify report as text (for people) and as JSON (for tools); docs/verification.md lists
// every field.
#include <lowbit/verify/report.hpp>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <sstream>

#include "text.hpp"

namespace lowbit::verify {
namespace {

using detail::error_text;
using detail::hex;
using detail::index_text;
using detail::readable;
using detail::shape_text;
using detail::shortest;

// ---- JSON -----------------------------------------------------------------------------------

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    switch (ch) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\t': out += "\\t"; break;
    default:
      if (static_cast<unsigned char>(ch) < 0x20) {
        out += "\\u00" + hex(static_cast<unsigned char>(ch), 2).substr(2);
      } else {
        out += ch;
      }
    }
  }
  return out + "\"";
}

// JSON has no Inf or NaN: they are the strings "inf", "-inf" and "nan".
std::string json_number(double x) {
  return std::isfinite(x) ? shortest(x) : json_string(shortest(x));
}

std::string json_ints(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t k = 0; k < v.size(); ++k)
    s += (k ? ", " : "") + std::to_string(v[k]);
  return s + "]";
}

} // namespace

std::string report::to_string() const {
  std::ostringstream os;
  if (ok())
    os << "verify passed: " << total << " element" << (total == 1 ? "" : "s") << " within "
       << policy << "\n";
  else
    os << "verify FAILED: " << failed << " of " << total << " elements outside " << policy << "\n";
  os << "  candidate " << candidate_dtype << ' ' << shape_text(shape) << ", reference "
     << reference_dtype;
  if (!input_dtype.empty())
    os << ", inputs " << input_dtype;
  os << "; ulp grid " << grid << "\n";
  os << "  checked " << checked << ", NaN matched " << nan_matches << ", NaN mismatches "
     << nan_mismatches << "\n";
  os << "  max abs error " << error_text(max_abs_error) << ", max rel error "
     << error_text(max_rel_error) << ", max ulp error " << error_text(max_ulp_error) << "\n";

  if (!worst.empty()) {
    const bool with_input = !input_dtype.empty();
    const bool with_allowed = policy.rfind("exact", 0) != 0;
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> head = {"index"};
    if (with_input)
      head.push_back("input");
    for (const char* h : {"candidate", "expected", "abs error", "ulp error"})
      head.push_back(h);
    if (with_allowed)
      head.push_back("allowed");
    head.push_back("");
    rows.push_back(head);
    for (const element& e : worst) {
      std::vector<std::string> row = {index_text(e.index)};
      if (with_input)
        row.push_back(e.input ? readable(*e.input) + " (" + e.input_hex + ")" : std::string());
      row.push_back(readable(e.candidate) + " (" + e.candidate_hex + ")");
      row.push_back(readable(e.reference) + " (" + e.reference_hex + ")");
      row.push_back(error_text(e.abs_error));
      row.push_back(error_text(e.ulp_error));
      if (with_allowed)
        row.push_back(error_text(e.allowed));
      row.push_back(e.nan_mismatch ? "NaN mismatch" : (e.failed ? "FAIL" : "ok"));
      rows.push_back(std::move(row));
    }
    std::vector<std::size_t> width(head.size(), 0);
    for (const auto& row : rows)
      for (std::size_t k = 0; k < row.size(); ++k)
        width[k] = std::max(width[k], row[k].size());
    os << "  worst elements:\n";
    for (const auto& row : rows) {
      std::string line = "   ";
      for (std::size_t k = 0; k < row.size(); ++k) {
        line += ' ';
        line += row[k];
        if (k + 1 < row.size())
          line += std::string(width[k] - row[k].size(), ' ') + ' ';
      }
      while (!line.empty() && line.back() == ' ')
        line.pop_back();
      os << line << "\n";
    }
  }
  if (!histogram.empty()) {
    os << "  ulp errors:";
    for (std::size_t k = 0; k < histogram.size(); ++k)
      os << (k ? " |" : "") << ' ' << histogram[k].label << ": " << histogram[k].count;
    os << "\n";
  }
  return os.str();
}

std::string report::to_json() const {
  std::ostringstream os;
  os << "{\"ok\": " << (ok() ? "true" : "false") << ", \"policy\": " << json_string(policy)
     << ", \"grid\": " << json_string(grid)
     << ", \"candidate_dtype\": " << json_string(candidate_dtype)
     << ", \"reference_dtype\": " << json_string(reference_dtype) << ", \"input_dtype\": "
     << (input_dtype.empty() ? std::string("null") : json_string(input_dtype))
     << ", \"shape\": " << json_ints(shape) << ", \"total\": " << total
     << ", \"checked\": " << checked << ", \"nan_matches\": " << nan_matches
     << ", \"nan_mismatches\": " << nan_mismatches << ", \"failed\": " << failed
     << ", \"max_abs_error\": " << json_number(max_abs_error)
     << ", \"max_rel_error\": " << json_number(max_rel_error)
     << ", \"max_ulp_error\": " << json_number(max_ulp_error) << ", \"worst\": [";
  for (std::size_t k = 0; k < worst.size(); ++k) {
    const element& e = worst[k];
    os << (k ? ", " : "") << "{\"index\": " << json_ints(e.index)
       << ", \"flat_index\": " << e.flat_index
       << ", \"input\": " << (e.input ? json_number(*e.input) : std::string("null"))
       << ", \"input_hex\": " << (e.input ? json_string(e.input_hex) : std::string("null"))
       << ", \"candidate\": " << json_number(e.candidate)
       << ", \"candidate_hex\": " << json_string(e.candidate_hex)
       << ", \"reference\": " << json_number(e.reference)
       << ", \"reference_hex\": " << json_string(e.reference_hex)
       << ", \"abs_error\": " << json_number(e.abs_error)
       << ", \"rel_error\": " << json_number(e.rel_error)
       << ", \"ulp_error\": " << json_number(e.ulp_error)
       << ", \"allowed\": " << json_number(e.allowed)
       << ", \"failed\": " << (e.failed ? "true" : "false")
       << ", \"nan_mismatch\": " << (e.nan_mismatch ? "true" : "false") << "}";
  }
  os << "], \"histogram\": [";
  for (std::size_t k = 0; k < histogram.size(); ++k) {
    const histogram_bucket& b = histogram[k];
    os << (k ? ", " : "") << "{\"label\": " << json_string(b.label)
       << ", \"lo\": " << json_number(b.lo) << ", \"hi\": " << json_number(b.hi)
       << ", \"count\": " << b.count << "}";
  }
  os << "]}";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const report& r) {
  return os << r.to_string();
}

} // namespace lowbit::verify
