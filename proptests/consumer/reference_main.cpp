// Uses the installed reference and generators: a user checking a converter of their own (here
// emu's, standing in) against the reference with lowbit's generators.
#include <cstdio>

#include <lowbit/emu/emu.hpp>
#include <lowbit/proptest/generators.hpp>
#include <lowbit/reference/round.hpp>

int main() {
  namespace emu = lowbit::emu;
  namespace ref = lowbit::reference;
  std::printf("reference::round(e4m3fn, 1.5, rne) = 0x%02X\n",
              ref::round(emu::e4m3fn, 1.5, emu::rne));
  std::printf("max_value(e5m2) = %s\n", ref::max_value(emu::e5m2).str().c_str());
  const bool ok = rc::check("e2m1fn edge values", [] {
    const float x = *lowbit::proptest::edge_values<float>(emu::e2m1fn);
    RC_ASSERT(emu::encode(emu::e2m1fn, x, emu::rne) ==
              ref::round(emu::e2m1fn, static_cast<double>(x), emu::rne));
  });
  std::printf("property: %s\n", ok ? "passed" : "FAILED");
  return ok ? 0 : 1;
}
