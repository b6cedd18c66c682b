// Uses an installed lowbit the way a downstream project would; run_consumer_test.cmake checks the
// output.
#include <cstdint>
#include <cstdio>

#include <lowbit/emu/emu.hpp>
#include <lowbit/kernels/cast.hpp>
#include <lowbit/verify/verify.hpp>

int main() {
  namespace emu = lowbit::emu;
  namespace kn = lowbit::kernels;
  std::printf("encode(e4m3fn, 1.5f, rne) = 0x%02X\n", emu::encode(emu::e4m3fn, 1.5f, emu::rne));
  const float in[4] = {1.5f, 464.0f, 465.0f, -0.0f};
  std::uint8_t out[4] = {};
  kn::cast(kn::tensor_view::contiguous(in, kn::dtype::float32, {4}),
           kn::tensor_view::contiguous(out, kn::dtype::uint8, {4}), emu::e4m3fn, emu::rne);
  std::printf("cast(e4m3fn) =");
  for (std::uint8_t c : out)
    std::printf(" 0x%02X", c);
  std::printf("\n");
  const std::uint8_t want[4] = {0x3C, 0x7E, 0x7F, 0x80};
  const auto r = lowbit::verify::compare(lowbit::verify::view(out), lowbit::verify::view(want),
                                         lowbit::verify::parse_policy("exact@e4m3fn"));
  std::printf("verify: %s\n", r.ok() ? "ok" : "failed");
  return 0;
}
