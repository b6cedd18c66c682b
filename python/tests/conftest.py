"""Shared settings of the Python tests.

The tests import the package that is on sys.path: the installed one, or <build>/python of a CMake
build (ctest sets PYTHONPATH). Helper modules (oracle.py, mlref.py) sit next to the tests.
"""

import os

from hypothesis import HealthCheck, settings

# No example database: runs from the source tree must not write into it, and every CI run then
# draws fresh examples (a failure prints the example and a reproduction blob).
settings.register_profile(
    "lowbit",
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# A fixed sequence of examples, for bisecting a failure: LOWBIT_HYPOTHESIS_PROFILE=lowbit-fixed.
settings.register_profile("lowbit-fixed", parent=settings.get_profile("lowbit"), derandomize=True)
settings.load_profile(os.environ.get("LOWBIT_HYPOTHESIS_PROFILE", "lowbit"))
