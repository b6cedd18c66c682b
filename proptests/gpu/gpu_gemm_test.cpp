// Work in progress.
#include <gtest/gtest.h>
