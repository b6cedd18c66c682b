// Work in progress.
#include "bindings.hpp"
namespace lowbit::python {
void bind_optim(pybind11::module_&) {}
} // namespace lowbit::python
