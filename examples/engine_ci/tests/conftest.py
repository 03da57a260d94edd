"""toyengine's own Hypothesis profile: kvsim's checks run under it (derandomized: the same inputs every run)."""

from hypothesis import settings

settings.register_profile("toyengine-ci", derandomize=True, database=None, deadline=None, max_examples=80)
settings.load_profile("toyengine-ci")
