"""A seed names the same inputs in every process: Hypothesis' pool of "local constants" (the literals of the
process' own modules) is emptied for kvsim's runs (`kvsim.engine.draws`)."""

import json
import subprocess
import sys
import textwrap

from kvsim.engine.draws import POOL_HOOK

# A module of the user's own, as an editable install, a loaded upstream file or a mutant is to Hypothesis: local.
PLANTED = "PLANTED = [" + ", ".join(str(700_001 + 7 * i) for i in range(60)) + "]\n"

DRAW = textwrap.dedent("""
    import json, sys
    from hypothesis import strategies as st
    if sys.argv[1] == "planted":
        import planted_constants  # noqa: F401
    from kvsim.engine.draws import derandomized_draws, own_draws
    if sys.argv[2] == "own":
        values = derandomized_draws(st.integers(0, 10**6), 300)
    else:
        from hypothesis import HealthCheck, given, settings
        values = []

        def keep(value):
            values.append(value)

        settings(max_examples=300, database=None, derandomize=True, deadline=None,
                 suppress_health_check=list(HealthCheck))(given(st.integers(0, 10**6))(keep))()
    print(json.dumps(values))
""")


def _draws(tmp_path, planted: bool, own: bool) -> list[int]:
    (tmp_path / "planted_constants.py").write_text(PLANTED)
    (tmp_path / "draw.py").write_text(DRAW)
    proc = subprocess.run([sys.executable, "draw.py", "planted" if planted else "plain", "own" if own else "raw"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_this_hypothesis_has_its_local_constants_where_kvsim_empties_them():
    import hypothesis

    major, minor = (int(p) for p in hypothesis.__version__.split(".")[:2])
    if (major, minor) >= (6, 131):  # the first releases that draw local constants
        assert POOL_HOOK, f"Hypothesis {hypothesis.__version__} keeps its local constants elsewhere"


def test_an_imported_module_does_not_change_a_derandomized_draw(tmp_path):
    planted = {700_001 + 7 * i for i in range(60)}
    raw = _draws(tmp_path, planted=True, own=False)
    if POOL_HOOK:
        # the hazard is real on this Hypothesis: left alone, it draws the planted module's literals
        assert planted & set(raw)
    own_plain = _draws(tmp_path, planted=False, own=True)
    own_planted = _draws(tmp_path, planted=True, own=True)
    assert own_plain == own_planted
    assert not planted & set(own_planted)
