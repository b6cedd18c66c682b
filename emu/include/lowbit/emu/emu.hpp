// Everything in lowbit::emu: formats, policies, the converter, Philox, value types.
#pragma once

#include <lowbit/emu/config.hpp>
#include <lowbit/emu/convert.hpp>
#include <lowbit/emu/format.hpp>
#include <lowbit/emu/fp.hpp>
#include <lowbit/emu/integer.hpp>
#include <lowbit/emu/philox.hpp>
#include <lowbit/emu/policy.hpp>
