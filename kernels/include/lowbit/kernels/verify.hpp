// Moved: lowbit::verify is a part of its own (verify/, target lowbit::verify). This forwarding
// header keeps the callers that still include it here compiling; include
// <lowbit/verify/verify.hpp> and link lowbit::verify instead.
#pragma once

#include <lowbit/verify/verify.hpp>
