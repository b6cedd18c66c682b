"""lowbit in ten lines: round float32 values to fp8 (OCP E4M3), look at the codes, decode them."""
import numpy as np
import lowbit

x = np.array([0.1, 1.0, 3.14159, 300.0, 1000.0], dtype=np.float32)
codes = lowbit.cast(x, "e4m3fn", saturate=True)  # nearest-even, clamp to +-448
print("codes:", " ".join(f"0x{c:02X}" for c in codes))
print("values:", lowbit.decode(codes, "e4m3fn").tolist())
info = lowbit.format_info("e4m3fn")
print(f"e4m3fn: max {info.max}, smallest subnormal {info.min_subnormal}")
