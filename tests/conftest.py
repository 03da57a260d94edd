"""Hypothesis profiles: `ci` (default; derandomized, no database, no deadline) and `dev` (longer, random).

Select with KVSIM_PROFILE=dev. The CI profile keeps the suite deterministic.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, database=None, deadline=None, max_examples=60,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                          print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=1000,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile(os.environ.get("KVSIM_PROFILE", "ci"))

