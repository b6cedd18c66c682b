#!/usr/bin/env python3
"""The dynamic tree maps (signed and unsigned) built with PyTorch float32 tensor operations, the
way the 8-bit optimizers' implementation builds them, printed as float32 bit patterns in the
format of proptests/data/dynamic_map_published.txt.

Runs where PyTorch is installed (the GPU machine). The table in the data file comes from lowbit's
C++ construction (codebook::dynamic_tree); this script is the independent witness for it:

    python3 scripts/device/dynamic_map_torch.py | diff proptests/data/dynamic_map_published.txt -

prints nothing and exits 0 when every bit agrees. The PyTorch version and CPU capability go to
stderr. The construction is described in docs/techniques/blockwise.md ("The dynamic tree map").
"""

import sys

import torch

TOTAL_BITS = 8
MAX_EXPONENT_BITS = 7

HEADER = (
    "# The dynamic tree map of the 8-bit optimizers paper as float32 bit patterns, ascending:\n"
    "# codebook::dynamic_tree(true) and dynamic_tree(false). Written by lowbit's construction,\n"
    "# checked against PyTorch by scripts/device/dynamic_map_torch.py (same format).\n"
    "# Lines: <signed|unsigned> <index 0..255> <8 hex digits>.\n"
)


def decade_values(decade_scale, fraction_items):
    """Midpoints of fraction_items evenly spaced float32 boundaries on [0.1, 1], times the
    decade's scale, each step a float32 tensor operation: linspace, the sum of neighbours, the
    halving, the product with the scale (a Python number, which PyTorch rounds to float32)."""
    boundaries = torch.linspace(0.1, 1, fraction_items, dtype=torch.float32, device="cpu")
    midpoints = (boundaries[:-1] + boundaries[1:]) / 2.0
    return (decade_scale * midpoints).tolist()


def dynamic_map(signed):
    # Every bit but one is a non-sign bit, also for the unsigned map: there the extra bit doubles
    # each decade's fraction count instead (as in the published construction).
    non_sign_bits = TOTAL_BITS - 1
    extra_items = 2 ** (non_sign_bits - MAX_EXPONENT_BITS) - 1
    values = []
    for i in range(MAX_EXPONENT_BITS):
        fraction_bits = i + non_sign_bits - MAX_EXPONENT_BITS + (0 if signed else 1)
        scale = 10 ** (-(MAX_EXPONENT_BITS - 1) + i)  # a float below 10^0, the int 1 there
        values += decade_values(scale, 2**fraction_bits + 1)
        if signed:
            values += decade_values(-scale, 2**fraction_bits + 1)
    if extra_items > 0:
        # Codes whose exponent bits are all zero (no indicator bit): more fractions in the last
        # decade. None with 8 bits and 7 exponent bits; kept so other settings count right.
        values += decade_values(scale, extra_items + 1)
        if signed:
            values += decade_values(-scale, extra_items + 1)
    values += [0.0, 1.0]
    assert len(values) == 2**TOTAL_BITS, len(values)
    values.sort()
    return torch.tensor(values, dtype=torch.float32)


def main():
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "?")()
    print(f"torch {torch.__version__}, CPU capability {capability}", file=sys.stderr)
    out = [HEADER]
    for name, signed in (("signed", True), ("unsigned", False)):
        bits = dynamic_map(signed).view(torch.int32).tolist()
        out += [f"{name} {i} {b & 0xFFFFFFFF:08x}\n" for i, b in enumerate(bits)]
    sys.stdout.write("".join(out))


if __name__ == "__main__":
    main()
