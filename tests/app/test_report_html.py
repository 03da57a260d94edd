"""`kvsim report --out DIR`: the static site, its structure, and the site in a real browser.

The browser test opens the site in headless Chromium (Debian's /usr/bin/chromium, driven by the
playwright package); it is skipped, with the reason, only where either is missing.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from kvsim.app import catalog
from kvsim.app.cli import main
from kvsim.conform.report import to_json
from kvsim.conform.targets import TargetResult

CHROMIUM = os.environ.get("KVSIM_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REG = catalog.load()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    work = tmp_path_factory.mktemp("report")
    # a release table's versions come as "sglang 0.5.23" where a run's are "0.5.23": the page names them one way
    diverged = TargetResult("sglang.staging_ring", "sglang 0.5.23", status="diverges", compared=12)
    diverged.diverge({"pages": 3, "slots": [{"id": 1, "ready": [0, 1]}]}, "slot 1", "slot 2")
    diverged.note = "/".join(["a_long_path_segment"] * 20)  # one unbreakable word wider than the page
    conform = work / "conform.json"
    conform.write_text(json.dumps({"engine": "sglang", "version": "0.5.23", "origin": "test",
                                   "results": [to_json(TargetResult("sglang.send_plan", "0.5.23", compared=40)),
                                               to_json(diverged)]}))
    bench = work / "bench.json"
    bench.write_text(json.dumps({"model": "pd-staging", "rows": [{"workers": 1, "states_per_second": 91000.0},
                                                                 {"workers": 2, "states_per_second": 160000.0}]}))
    out = work / "site"
    code = main(["report", "--out", str(out), "--conform", str(conform), "--bench", str(bench)])
    return out, code


def test_the_site_has_every_bug_page_and_chart_and_nothing_remote(site):
    out, code = site
    assert code == 0  # every bug report holds
    index = (out / "index.html").read_text()
    for bug in REG.bugs.values():
        page = out / "bugs" / f"{bug.id}.html"
        assert f'href="bugs/{bug.id}.html"' in index and page.exists(), bug.id
        text = page.read_text()
        assert f"kvsim repro {bug.id}" in text and bug.source.split(" ")[0] in text, bug.id
        if bug.status != "not reproducible":
            assert f'src="../charts/{bug.id}.svg"' in text and (out / "charts" / f"{bug.id}.svg").exists(), bug.id
    for model in REG.models.values():
        assert f"<b>{model.name}</b>" in index
        assert all(f"<code>{v}</code>" in index for v in model.variants.names)
    conform = (out / "conform.html").read_text()
    assert "sglang.staging_ring" in conform and "diverges" in conform
    assert 'src="figures/bench-0-0.svg"' in (out / "bench.html").read_text()
    for path in out.rglob("*"):
        if path.suffix in (".html", ".css", ".svg"):
            text = path.read_text()
            assert "<script" not in text and "@import" not in text and "@font-face" not in text, path
            assert not re.search(r'(?:src|href)="(?:https?:)?//', text), path


def test_bad_conform_and_bench_files_are_one_line_errors(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["report", "--out", str(tmp_path / "s"), "--conform", str(bad), "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["error"]["field"] == "--conform"
    assert main(["report", "--out", str(tmp_path / "s"), "--bench", str(tmp_path / "missing.json")]) == 2
    assert "--bench" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()  # refused before anything was written


def _browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed (pip install playwright)")
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install -y chromium)")
    return sync_playwright


def test_the_site_in_headless_chromium(site, tmp_path):
    sync_playwright = _browser()
    out, _ = site
    bug = "sglang-05c7ebf-staging-dup-ready"
    shots = Path(os.environ.get("KVSIM_SCREENSHOTS", tmp_path))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("requestfailed", lambda r: errors.append(f"failed: {r.url}"))
            for name, url in (("index", "index.html"), ("bug", f"bugs/{bug}.html"), ("bench", "bench.html")):
                page.goto((out / url).as_uri())
                page.wait_for_load_state("load")
                images = page.evaluate("Array.from(document.images).map(i => [i.src, i.complete, i.naturalWidth])")
                assert all(done and width > 0 for _, done, width in images), images
                if name == "bug":
                    assert len(images) == 1 and images[0][0].endswith(f"charts/{bug}.svg")
                    assert page.locator("h1").inner_text() == bug
                if name == "index":
                    assert page.locator('a[href^="bugs/"]').count() == len(REG.bugs)
                if name != "bench":
                    page.screenshot(path=str(shots / f"report-{name}.png"), full_page=name == "bug")
                    assert (shots / f"report-{name}.png").stat().st_size > 10_000
        finally:
            browser.close()
    assert errors == []


ZEROING, BLOCKS = "vllm-d6af803-packed-zeroing-stride", "vllm-48195-connector-hit-max-over-groups"


def test_the_pictures_nested_fields_and_the_layout_in_headless_chromium(site, tmp_path):
    """At 1400 px: no page runs off the right edge; the zeroing counterexample's memory picture shows each
    allocation's owned bytes, padding, the bytes asked for and written and the first byte outside; the block
    picture shows the pool (held, cached, null) and the free queue; nested fields are tables, not JSON."""
    sync_playwright = _browser()
    out, _ = site
    shots = Path(os.environ.get("KVSIM_SCREENSHOTS", tmp_path))
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            for url in ("index.html", "conform.html", "bench.html", f"bugs/{ZEROING}.html", f"bugs/{BLOCKS}.html"):
                page.goto((out / url).as_uri())
                assert page.evaluate("document.documentElement.scrollWidth") <= 1400, url
            page.goto((out / "conform.html").as_uri())
            versions = page.locator("table >> nth=0").locator("tbody tr td:nth-child(2)").all_inner_texts()
            assert versions == ["0.5.23", "0.5.23"]
            divergence = page.locator("h3 + table").first
            assert divergence.locator("table.nested").count() == 2  # the input, and its list of slots inside
            assert "{" not in divergence.inner_text()

            page.goto((out / "bugs" / f"{ZEROING}.html").as_uri())
            columns = page.locator("table.nested thead th").all_inner_texts()
            assert "strides" in columns and "layer" in columns  # geometry.views: a table, a row per view
            assert not page.locator("td", has_text='[{"').count()  # no JSON left in a cell
            svg = page.locator("div.picture svg")
            bar = svg.locator("g.allocation")
            assert bar.count() == 1 and bar.get_attribute("data-label") == "allocation 0"
            assert bar.locator("rect.owner:not([data-padding])").count() >= 1  # bytes a view owns
            assert bar.locator("rect.owner[data-padding]").count() >= 1  # padding
            assert bar.locator("rect.asked").count() >= 1 and bar.locator("rect.touched").count() >= 1
            marker = bar.locator("g.first-outside")
            assert marker.count() == 1 and "first byte outside: 4 = allocation 0 + 4 (padding" in marker.text_content()
            svg.screenshot(path=str(shots / "report-zeroing-memory.png"))

            page.goto((out / "bugs" / f"{BLOCKS}.html").as_uri())
            svg = page.locator("div.picture svg")
            kinds = svg.locator("g.block").evaluate_all("gs => gs.map(g => g.dataset.kind)")
            queue = svg.locator("g.queued").evaluate_all("gs => gs.map(g => Number(g.dataset.id))")
            assert kinds[0] == "null" and "held" in kinds and "cached" in kinds
            assert queue and all(kinds[b] in ("free", "cached") for b in queue)
            assert "block pool after step" in svg.text_content()
            svg.screenshot(path=str(shots / "report-kv-cache-blocks.png"))
            page.goto((out / "conform.html").as_uri())
            page.screenshot(path=str(shots / "report-conform.png"), full_page=True)
        finally:
            browser.close()


def _made(bugs, registry):
    """Reproductions as a forked worker hands them back (plain fields), without running them: no counterexample."""
    from kvsim.app.repro import BugRun, ReproResult

    fields = (True, True, 1, 0.0, None, "", 0.0, 100)
    return [ReproResult.from_fields(BugRun.resolve(b, registry), fields) for b in bugs]


@pytest.mark.parametrize("stopped", ["max-seconds", "interrupt", None])
def test_reports_made_ahead_on_workers_are_used_and_a_stop_names_the_rest(tmp_path, monkeypatch, stopped):
    """`build_site(batch=...)` (`kvsim report` on forked workers): the reproductions the batch made are the pages'
    (none is run again); after a --max-seconds stop the rest are named as not run, after an interrupt the stop goes
    on; a report the batch did not make without a stop (its worker's error) is reproduced in the process."""
    from kvsim.app import site
    from kvsim.app.show import sources
    from kvsim.engine.interrupt import Interrupted

    bugs = list(REG.bugs.values())
    cheap = next(b for b in bugs if b.id == "flashinfer-4031-nontransactional-replan")  # a 13-state search
    made = _made(bugs[:3], REG) if stopped else _made([b for b in bugs if b is not cheap], REG)
    ran = []
    real = site.sources.reproduced
    monkeypatch.setattr(sources, "_REPRODUCED", {})
    monkeypatch.setattr(site.sources, "reproduced", lambda bug, *a: ran.append(bug.id) or real(bug, *a))
    stops = []
    build = lambda: site.build_site(str(tmp_path / "site"), REG, batch=lambda b: (made, stopped),
                                    on_stop=lambda: stops.append(1))
    if stopped == "interrupt":
        with pytest.raises(Interrupted):
            build()
        return
    result = build()
    assert stops == [1]
    if stopped == "max-seconds":
        assert result.bugs == 3 and result.not_run == [b.id for b in bugs[3:]]
        assert sorted(p.name for p in (tmp_path / "site" / "bugs").iterdir()) == sorted(f"{b.id}.html" for b in bugs[:3])
        assert set(ran) == {b.id for b in bugs[:3]}  # read from what the batch made (the same results, not rerun)
        assert all(sources._REPRODUCED[(b.id, 0)] is m for b, m in zip(bugs, made))
    else:
        assert result.bugs == len(bugs) and result.not_run == [] and result.holding == sum(m.ok for m in made) + 1
        kept = sources._REPRODUCED[(cheap.id, 0)]
        assert kept not in made and kept.reproduced and kept.examples > 1  # run here, for real (13 states)
