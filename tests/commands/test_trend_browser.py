"""``ckpt trend --html``'s page opened in a real browser, headless Chromium from the system
packages (``tests/support/browser.py``): on the diverged training run its plots are drawn, every
leaf is named, each finding links to its leaf's row, and the page logs no console message and
asks the network for nothing. The checks themselves are shown to catch a page that does."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.support import browser
from tests.support.trend_runs import NAN_LEAF, NAN_STEP, TrendRuns

#: The colours the page draws with (ckpt_cli/commands/trend_html.py): curves, NaN/Inf cells.
CURVE = (0x15, 0x65, 0xC0)
NONFINITE = (0xD5, 0x00, 0x00)
#: A heat-map cell is 20 x 20 pixels of its colour.
CELL_PIXELS = 20 * 20


class _Dom(HTMLParser):
    """The serialized DOM: tags, the leaf names (``<code title>``) inside each element with an
    id, links, and resource URLs."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.names_in: dict[str, list[str]] = {}
        self.links: list[str] = []
        self.resources: list[str] = []
        self.text: list[str] = []
        self._open: list[tuple[str, str]] = []  # (tag, id) of the elements with an id

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        a = dict(attrs)
        if a.get("id"):
            self._open.append((tag, str(a["id"])))
            self.names_in[str(a["id"])] = []
        if tag == "code" and a.get("title"):
            for _, ident in self._open:
                self.names_in[ident].append(str(a["title"]))
        if tag == "a" and a.get("href"):
            self.links.append(str(a["href"]))
        for key in ("src", "href", "srcset", "poster", "data"):
            value = a.get(key) or ""
            if "://" in value or value.startswith("//"):
                self.resources.append(value)
        if "url(" in (a.get("style") or ""):
            self.resources.append(str(a["style"]))

    def handle_endtag(self, tag: str) -> None:
        if self._open and self._open[-1][0] == tag:
            self._open.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _dom(html: str) -> _Dom:
    dom = _Dom()
    dom.feed(html)
    return dom


@pytest.fixture
def page(cli, trend_runs: TrendRuns, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    """The page of the diverged run, as ``ckpt trend --html`` writes it."""
    out = tmp_path / "trend.html"
    r = cli("trend", trend_runs.diverged, "--html", out, "--json")
    assert r.code == 0, r.stderr
    return out


def test_the_page_renders_in_chromium_offline_and_quietly(  # type: ignore[no-untyped-def]
    cli, trend_runs: TrendRuns, page: Path, tmp_path: Path
) -> None:
    seen = browser.visit(page, tmp_path)
    assert seen.console == []  # no error, no message
    assert seen.requests == []  # nothing asked of the network
    dom = _dom(seen.dom)
    assert "script" not in dom.tags and dom.resources == []
    doc = cli("trend", trend_runs.diverged, "--json").json()
    names = [lf["name"] for lf in doc["leaves"]]
    assert len(names) == 13
    # The plots, as the browser built them: a chart per metric, two per group and per leaf, the
    # heat map with a cell per leaf and step.
    assert dom.tags.count("svg") == 1 + 2 * 3 + 2 * len(names) + 1
    assert dom.tags.count("polyline") >= 1 + 2 * len(names)
    assert dom.tags.count("rect") == sum(len(lf["steps"]) for lf in doc["leaves"])
    text = "".join(dom.text)
    assert all(name in text for name in names)
    # Each finding links to the row of its leaf, which the browser found in the DOM.
    findings = doc["findings"]
    assert findings and findings[0]["leaf"] == NAN_LEAF and findings[0]["step"] == NAN_STEP
    anchors = [link[1:] for link in dom.links if link.startswith("#leaf-")]
    assert len(anchors) == len(findings) + len(names)  # the findings', then the heat map's
    for finding, anchor in zip(findings, anchors, strict=False):
        assert dom.names_in[anchor] == [finding["leaf"]], (finding, anchor)


def test_the_browser_draws_the_curves_and_the_nonfinite_cells(  # type: ignore[no-untyped-def]
    cli, trend_runs: TrendRuns, page: Path, tmp_path: Path
) -> None:
    png = tmp_path / "page.png"
    browser.screenshot(page, png, tmp_path, 1100, 2400)
    doc = cli("trend", trend_runs.diverged, "--json").json()
    nonfinite = sum(1 for lf in doc["leaves"] for s in lf["steps"] if s["nonfinite"])
    assert nonfinite == 10  # Dense_0.kernel at steps 5 and 6, what it spread to at step 6
    assert browser.count_pixels(png, NONFINITE) == nonfinite * CELL_PIXELS
    assert browser.count_pixels(png, CURVE) > 1000  # the curves' points and lines


def test_the_checks_catch_a_page_that_errs_and_fetches(tmp_path: Path) -> None:
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<!DOCTYPE html><html><body><p>bad</p>"
        '<img src="http://example.com/x.png"><script>console.error("boom"); nope();</script>'
        "</body></html>"
    )
    seen = browser.visit(bad, tmp_path)
    assert any('"boom"' in line for line in seen.console), seen.console
    assert any("Uncaught ReferenceError" in line for line in seen.console), seen.console
    assert seen.requests == ["http://example.com/x.png"]
    assert _dom(seen.dom).resources == ["http://example.com/x.png"]


#: The colour of a NaN/Inf step's mark across a curve.
NONFINITE_MARK = (0xFF, 0x17, 0x44)


def test_the_browser_marks_nan_steps_on_every_curve(  # type: ignore[no-untyped-def]
    cli, trend_runs: TrendRuns, page: Path, tmp_path: Path
) -> None:
    """Every curve of a leaf (or group, or metric) at a step holding NaN/Inf has a red mark
    there, drawn by the browser, and the verdict heads the page: no curve drops to zero."""
    doc = cli("trend", trend_runs.diverged, "--json").json()
    bad = [(lf["name"], s["step"]) for lf in doc["leaves"] for s in lf["steps"] if s["nonfinite"]]
    assert bad
    seen = browser.visit(page, tmp_path)
    html = seen.dom
    assert html.count('class="nonfinite"') >= 2 * len(bad)  # each leaf's norm and ratio
    assert 'id="divergence"' in html and f"from step {NAN_STEP} on" in html
    png = tmp_path / "marks.png"
    browser.screenshot(page, png, tmp_path, 1100, 2400)
    assert browser.count_pixels(png, NONFINITE_MARK) > 50
