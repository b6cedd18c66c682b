// Everything in lowbit::emu: formats, policies, the converter, Philox, value types, targets.
#pragma once

#include <lowbit/emu/config.hpp>
#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/dtype.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/fp.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/emu/philox.hpp>
#include <lowbit/emu/policy.hpp>
#include <lowbit/emu/target.hpp>
