// Checking a candidate array against a reference: bit for bit, within n ulps of a format's grid,
// within an absolute/relative tolerance, or within a bound computed per element. The result is a
// report (counts, largest errors, the worst elements with their index and bit patterns, a
// histogram of ulp distances) that prints readably, so a failing test says where and by how much:
//
//   const auto r = lowbit::verify::compare(lowbit::verify::view(out), lowbit::verify::view(ref),
//                                          lowbit::verify::ulp(1, lowbit::emu::e4m3fn));
//   EXPECT_TRUE(r.ok()) << r;  // GoogleTest; no dependency of the library on it
//
// Host memory only (CUDA views are refused with a message). docs/verification.md defines every
// policy and every field of the report; Python's lowbit.verify and `lowbit verify` call this.
//
// This header includes the three parts: policy.hpp (the policies and their text form),
// report.hpp (the report, text and JSON) and compare.hpp (the comparison and container views).
#pragma once

#include <lowbit/verify/compare.hpp>
#include <lowbit/verify/policy.hpp>
#include <lowbit/verify/report.hpp>
