"""What a person sees: the search page at ``/``, ``/docs`` with no network, and ``diagnose.html``.

The routes are checked in process (same-origin references, the key rule, escaping); the pages
in a real headless Chromium (Debian's, driven by Playwright) against a real ``magretrieve
serve`` process: a query typed with the keyboard, the hits and their score bars measured
against the ``/search`` answer, every request recorded and kept on the server's origin, no
console error, no horizontal scroll at 400 px, the API key flow, and ``diagnose.html`` opened
from disk with every figure decoded.

Screenshots go to the test's tmp folder; with ``MAGRETRIEVE_SCREENSHOTS=DIR`` they are also
written to DIR (``docs/img`` holds the ones the docs show: scripts/screenshots.sh).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx
import pytest
from click.testing import CliRunner

from magretrieve.server.auth import needs_key
from tests.support.server import KEY, start_server

SCREENSHOTS_ENV = "MAGRETRIEVE_SCREENSHOTS"


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, tiny_model_dir) -> Path:
    from magretrieve.export import export_model

    out = tmp_path_factory.mktemp("pages") / "export"
    export_model(tiny_model_dir, out, mode="qnorm", exporter="torchscript", overwrite=True)
    return out


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory, export_dir, tiny_beir_dir) -> Path:
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever

    folder = tmp_path_factory.mktemp("pages-store") / "ix"
    with Retriever.load(export_dir, store=f"faiss:{folder}") as r:
        index_corpus(r, tiny_beir_dir / "corpus.jsonl", progress=False)
    return folder


@pytest.fixture(scope="module")
def cosine_export(tmp_path_factory, tiny_model_dir) -> Path:
    """A cosine export: every stored ‖d‖ is 1 up to float32 rounding."""
    from magretrieve.export import export_model

    out = tmp_path_factory.mktemp("pages-cos") / "export"
    export_model(tiny_model_dir, out, mode="cosine", exporter="torchscript", overwrite=True)
    return out


@pytest.fixture(scope="module")
def cosine_store(tmp_path_factory, cosine_export, tiny_beir_dir) -> Path:
    from magretrieve.serving.indexing import index_corpus
    from magretrieve.serving.retriever import Retriever

    folder = tmp_path_factory.mktemp("pages-cos-store") / "ix"
    with Retriever.load(cosine_export, store=f"faiss:{folder}") as r:
        index_corpus(r, tiny_beir_dir / "corpus.jsonl", progress=False)
    return folder


#: A hub prior strong enough to reorder the tiny corpus, and hub plus an offset prior.
HUB = {"kind": "document_prior", "method": "hub", "beta": 1.0, "k": 3}
CSLS = {"kind": "document_prior", "method": "csls", "alpha": 0.5, "k": 3, "bank": "corpus"}
HUB_CSLS = {"kind": "document_prior", "method": "hub+csls", "parts": [HUB, CSLS]}


def rescaled(cosine_store: Path, prior: dict, folder: Path) -> Path:
    """``magretrieve rescale --prior-file`` of the cosine store into ``folder``."""
    from magretrieve.cli import main

    prior_file = folder.parent / f"{folder.name}-prior.json"
    prior_file.write_text(json.dumps(prior))
    args = ["rescale", "--source", f"faiss:{cosine_store}", "--target", f"faiss:{folder}"]
    result = CliRunner().invoke(main, [*args, "--prior-file", str(prior_file), "--json"])
    assert result.exit_code == 0, result.output
    return folder


@pytest.fixture(scope="module")
def hub_store(tmp_path_factory, cosine_store) -> Path:
    return rescaled(cosine_store, HUB, tmp_path_factory.mktemp("pages-hub") / "ix")


@pytest.fixture(scope="module")
def hub_csls_store(tmp_path_factory, cosine_store) -> Path:
    return rescaled(cosine_store, HUB_CSLS, tmp_path_factory.mktemp("pages-hub-csls") / "ix")


def shot(page: Any, tmp_path: Path, name: str, **kwargs: Any) -> Path:
    """Screenshot into tmp_path, and into $MAGRETRIEVE_SCREENSHOTS when it is set."""
    path = tmp_path / name
    page.screenshot(path=str(path), **kwargs)
    assert path.stat().st_size > 5000
    target = os.environ.get(SCREENSHOTS_ENV)
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(target) / name)
    return path


class Refs(HTMLParser):
    """Every URL an HTML page makes the browser load (src, href of link, and srcset)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("src"):
            self.urls.append(a["src"] or "")
        if tag == "link" and a.get("href"):
            self.urls.append(a["href"] or "")


def page_refs(html: str) -> list[str]:
    parser = Refs()
    parser.feed(html)
    return parser.urls


# ----------------------------------------------------------------------------- in process


@pytest.fixture(scope="module")
def client(export_dir, store_dir, tmp_path_factory):
    from fastapi.testclient import TestClient

    from magretrieve.server import create_app

    store = tmp_path_factory.mktemp("pages-client") / "ix"
    shutil.copytree(store_dir, store)
    with TestClient(create_app(export_dir, f"faiss:{store}", api_key=KEY)) as c:
        yield c


def test_page_and_assets_open_without_the_key_while_the_api_needs_it(client) -> None:
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'data-key-required="true"' in page.text
    # the shared head (static/head.html) is filled in: a whole page, no mark left
    assert page.text.startswith('<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">')
    assert "{{" not in page.text and "<title>magretrieve search</title>" in page.text
    csp = page.headers["content-security-policy"]
    for directive in ("default-src 'self'", "script-src 'self'", "connect-src 'self'"):
        assert directive in csp
    refs = page_refs(page.text)
    assert {"static/page.css", "static/page.js", "static/favicon.svg"} <= set(refs)
    for ref in refs:
        url = urljoin("http://testserver/", ref)
        assert urlsplit(url).netloc == "testserver", ref
        assert client.get(url).status_code == 200, ref
    # the API the page calls still needs the key; /docs and its schema are open like the page
    assert client.post("/search", json={"query": "statin"}).status_code == 401
    docs = client.get("/docs")
    assert docs.status_code == 200 and docs.headers["content-type"].startswith("text/html")
    assert 'data-scheme="bearer"' in docs.text
    hdr = {"Authorization": f"Bearer {KEY}"}
    assert client.post("/search", json={"query": "statin"}, headers=hdr).status_code == 200
    # the schema declares the key on exactly the operations that need it (Swagger's Authorize)
    schema = client.get("/openapi.json").json()
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            declared = operation.get("security") == [{"bearer": []}]
            assert declared == needs_key(path, method), (method, path)
    assert schema["paths"]["/search"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in schema["paths"]["/info"]["get"]
    # only the packaged files: no traversal, no listing, no other name
    for path in ("/static/", "/static/nope.js", "/static/page.js/x", "/staticx"):
        assert client.get(path).status_code in (401, 404), path
    assert needs_key("/static/../search") and not needs_key("/docs") and not needs_key("/")
    assert needs_key("/docs", "POST") and needs_key("/openapi.json", "POST")
    # the page is open to read, but POST / is TEI's /embed alias: it encodes, so it needs the key
    assert needs_key("/", "POST") and needs_key("/static/app.js", "POST")
    assert client.get("/redoc").status_code in (401, 404)


def test_docs_references_only_this_origin_and_each_answers(export_dir) -> None:
    from fastapi.testclient import TestClient

    from magretrieve.server import create_app

    with TestClient(create_app(export_dir)) as c:
        docs = c.get("/docs")
        assert docs.status_code == 200
        assert docs.text.startswith("<!doctype html>") and "{{" not in docs.text
        refs = page_refs(docs.text)
        assert "static/swagger/swagger-ui-bundle.js" in refs and "static/docs.js" in refs
        assert not re.search(r"https?://", docs.text), "no absolute URL in /docs"
        for ref in refs:
            url = urljoin("http://testserver/docs", ref)
            assert urlsplit(url).netloc == "testserver"
            resp = c.get(url)
            assert resp.status_code == 200 and len(resp.content) > 100, ref
        assert c.get("/openapi.json").json()["info"]["title"] == "magretrieve"
        # the initializer never asks the public validator
        assert "validatorUrl: null" in c.get("/static/docs.js").text
        # the page is no API operation (only POST /, TEI's /embed alias, is in the schema)
        schema = c.get("/openapi.json").json()
        assert set(schema["paths"].get("/", {})) == {"post"}
        # a server without a key declares none (no Authorize button)
        assert "securitySchemes" not in schema.get("components", {})
        assert not any("security" in op for ops in schema["paths"].values() for op in ops.values())


def hub_multipliers(store: Path, beta: float, k: int) -> dict[str, float]:
    """m(d) = exp(−β·z(d)) by hand: z is each document's mean cosine to its k nearest other
    documents, standardized over the corpus."""
    import numpy as np

    from magretrieve.stores import open_store

    with open_store(f"faiss:{store}") as vs:
        ids = sorted(vs.iter_ids())
        units = np.stack([rec.vector for rec in vs.get(ids)]).astype(np.float64)
    units /= np.linalg.norm(units, axis=1, keepdims=True)
    cos = units @ units.T
    np.fill_diagonal(cos, -np.inf)
    hub = np.sort(cos, axis=1)[:, -k:].mean(axis=1)
    z = (hub - hub.mean()) / hub.std()
    return dict(zip(ids, np.exp(-beta * z).tolist(), strict=True))


def test_info_says_which_prior_the_store_carries(
    cosine_export, cosine_store, hub_store, hub_csls_store
) -> None:
    from fastapi.testclient import TestClient

    from magretrieve.server import create_app

    with TestClient(create_app(cosine_export, f"faiss:{cosine_store}")) as c:
        assert c.get("/info").json()["store"]["prior"] is None
    hub = {
        "name": "hub",
        "label": "hub(beta=1,k=3)",
        "params": {"beta": 1.0, "k": 3},
        "multiplier": True,
        "offset": False,
    }
    with TestClient(create_app(cosine_export, f"faiss:{hub_store}")) as c:
        info = c.get("/info").json()
        assert info["mode"] == "cosine" and info["store"]["prior"] == hub
        hits = c.post("/search", json={"query": "statins heart risk", "k": 12}).json()["hits"]
    # what the page labels as the prior is the prior's multiplier, not a magnitude
    want = hub_multipliers(cosine_store, 1.0, 3)
    assert max(want.values()) / min(want.values()) > 1.5
    for h in hits:
        assert h["doc_norm"] == h["multiplier"] == pytest.approx(want[h["id"]], rel=1e-4)
        assert h["offset"] == 0
    csls = {
        "name": "csls",
        "label": "csls(alpha=0.5,k=3,bank=corpus)",
        "params": {"alpha": 0.5, "k": 3, "bank": "corpus"},
        "multiplier": False,
        "offset": True,
    }
    with TestClient(create_app(cosine_export, f"faiss:{hub_csls_store}")) as c:
        prior = c.get("/info").json()["store"]["prior"]
    assert prior == {
        "name": "hub+csls",
        "label": "hub(beta=1,k=3)+csls(alpha=0.5,k=3,bank=corpus)",
        "params": {},
        "multiplier": True,
        "offset": True,
        "parts": [hub, csls],
    }


def test_diagnose_html_escapes_report_text_and_inlines_figures(tmp_path) -> None:
    import numpy as np

    from magretrieve.diagnose import plots
    from magretrieve.diagnose.html import render_html

    png = plots.norm_histograms(
        np.array([2.0, 2.2, 2.4]),
        np.array([1.0, 1.5, 1.9, 2.1]),
        1.3,
        tmp_path / "norms_relevant_vs_nonrelevant.png",
        "t",
    )
    evil = '<script>alert("x")</script>'
    report = {
        "model": evil,
        "data": "beir:train",
        "encoder": {"mode": "qnorm", "gamma_q": 1.0, "gamma_d": 0.0},
        "recommendation": {
            "mode": "qnorm",
            "reasons": [f"because {evil}"],
            "warnings": [],
            "next_steps": ["magretrieve train --out 'a&b'"],
        },
        "magnitude": {
            "mode": "cosine",
            "cohens_d": 1.3,
            "norm_cv": float("nan"),
            "mean_norm_relevant": 2.2,
            "mean_norm_nonrelevant": 1.625,
            "verdict": evil,
            "ndcg_at_10": {},
        },
        "runs": [],
        "side": {"skipped": True},
        "plots": [str(png)],
    }
    page = render_html(report, report["plots"])
    assert "<script" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "$ magretrieve train --out &#x27;a&amp;b&#x27;" in page
    assert page.count('src="data:image/png;base64,') == 1
    assert not re.search(r'(src|href)="(?!data:)', page), "nothing loaded from elsewhere"
    # the verdict comes before the first measurement and its figure
    assert page.index("Recommended: qnorm") < page.index("Magnitude signal") < page.index("<img")
    assert "Cohen's d +1.30: relevant documents are longer vectors" in page
    assert '<td class="num">–</td>' in page  # NaN CV shown as a dash, not "nan"


# ----------------------------------------------------------------------------- in a browser


class Recorder:
    """Every request, console error and page error of one browser page."""

    def __init__(self, page: Any) -> None:
        self.requests: list[Any] = []
        self.errors: list[str] = []
        page.on("request", lambda r: self.requests.append(r))
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))

    def urls(self) -> list[str]:
        return [r.url for r in self.requests]

    def foreign(self, origin: str) -> list[str]:
        return [u for u in self.urls() if not u.startswith(origin + "/")]


def decomposition(hits: list[dict]) -> tuple[list[float], list[int]]:
    """Per hit, the solid part of its bar as a fraction of the widest bar, and its cosine rank
    among the hits (what page.js draws), computed here from the /search answer."""
    mean = sum(h["doc_norm"] for h in hits) / len(hits)
    extents = []
    for h in hits:
        base = h["query_norm"] * mean * h["cosine"]
        magnitude = h["query_norm"] * (h["doc_norm"] - mean) * h["cosine"]
        extents.append(max(base, 0) + max(magnitude, 0) + max(h["offset"], 0))
    scale = max(extents)
    solid = [max(h["score"], 0) / scale for h in hits]
    by_cos = sorted(range(len(hits)), key=lambda i: (-hits[i]["cosine"], hits[i]["rank"]))
    cos_rank = [0] * len(hits)
    for r, i in enumerate(by_cos, start=1):
        cos_rank[i] = r
    return solid, cos_rank


def read_bars(page: Any) -> list[dict]:
    return page.evaluate(
        """() => [...document.querySelectorAll('#hits > li')].map(li => {
            const bar = li.querySelector('.bar');
            const w = bar.getBoundingClientRect().width;
            const segs = [...bar.querySelectorAll('.seg')].map(s => ({
                kind: s.className.replace('seg ', ''), frac: s.getBoundingClientRect().width / w}));
            return {id: li.querySelector('.id').textContent, badge: li.querySelector('.badge').textContent,
                    score: li.querySelector('.score').textContent, label: bar.getAttribute('aria-label'),
                    segs};
        })"""
    )


def read_hits(page: Any) -> list[dict]:
    """Per hit: its gauge (label, value, fill width as a fraction of the track, classes), its
    parts (term -> value) and its badge."""
    return page.evaluate(
        """() => [...document.querySelectorAll('#hits > li')].map(li => {
            const g = li.querySelector('.gauge');
            const fill = g.querySelector('.gauge-fill');
            const track = g.querySelector('.gauge-track').getBoundingClientRect().width;
            return {id: li.querySelector('.id').textContent,
                    badge: li.querySelector('.badge').textContent,
                    label: li.querySelector('.bar').getAttribute('aria-label'),
                    gauge: g.querySelector('.gauge-label').textContent,
                    value: g.querySelector('.gauge-value').textContent,
                    fill: fill.getBoundingClientRect().width / track, fill_class: fill.className,
                    terms: [...li.querySelectorAll('.parts dt')].map(d => d.textContent),
                    values: [...li.querySelectorAll('.parts dd')].map(d => d.textContent)};
        })"""
    )


def gauges(hits: list[dict]) -> list[tuple[str, float, str]]:
    """What page.js draws for each hit's ‖d‖ (or m(d)) against the hits' mean: the text, the
    fill as a fraction of the track (half of it at the widest), and the fill's direction.
    Within 0.1 % of the mean it reads "same" and stays empty; the widest deviation fills half
    the track, but never a deviation under 1 % of the mean."""
    norms = [h["doc_norm"] for h in hits]
    mean = sum(norms) / len(norms)
    span = max(max(abs(n - mean) for n in norms), 0.01 * mean)
    out = []
    for n in norms:
        rel = (n - mean) / mean
        if abs(rel) < 1e-3:
            out.append(("same", 0.0, "gauge-fill"))
        else:
            text = f"{'+' if rel > 0 else '−'}{100 * abs(rel):.1f} %"
            out.append(
                (text, 0.5 * abs(n - mean) / span, f"gauge-fill {'up' if rel > 0 else 'down'}")
            )
    return out


def want_badges(hits: list[dict], mover: str) -> list[str]:
    _, cos_rank = decomposition(hits)
    out = []
    for pos, rank in enumerate(cos_rank, start=1):
        delta = rank - pos
        out.append(
            f"▲ {delta} {mover}"
            if delta > 0
            else f"▼ {-delta} {mover}"
            if delta < 0
            else "same rank as cosine"
        )
    return out


def search_on_page(page: Any, url: str, query: str) -> None:
    page.goto(url + "/")
    page.wait_for_selector('#ready[data-state="ready"]')
    page.locator('[data-fact="count"]', has_text=re.compile(r"\d")).wait_for()
    page.fill("#q", query)
    page.press("#q", "Enter")
    page.wait_for_selector("#hits > li")


def no_horizontal_scroll(page: Any) -> bool:
    return bool(
        page.evaluate(
            "() => document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        )
    )


@pytest.mark.integration
def test_search_page_in_chromium(chromium, export_dir, store_dir, tmp_path) -> None:
    store = tmp_path / "ix"
    shutil.copytree(store_dir, store)
    server = start_server(export_dir, "--store", f"faiss:{store}", key=None, log_dir=tmp_path)
    try:
        want = httpx.post(server.url + "/search", json={"query": "statins heart risk", "k": 10})
        hits = want.json()["hits"]
        info = httpx.get(server.url + "/info").json()

        context = chromium.new_context(viewport={"width": 1100, "height": 900})
        page = context.new_page()
        rec = Recorder(page)
        page.goto(server.url + "/")
        page.wait_for_selector('#ready[data-state="ready"]')
        page.locator('[data-fact="count"]', has_text=re.compile(r"\d")).wait_for()
        facts = page.evaluate(
            "() => Object.fromEntries([...document.querySelectorAll('[data-fact]')]"
            ".map(d => [d.dataset.fact, d.textContent]))"
        )
        assert facts == {
            "mode": info["mode"],
            "gamma_q": f"{info['gamma_q']:.2f}",
            "gamma_d": f"{info['gamma_d']:.2f}",
            "dimension": str(info["dimension"]),
            "store": "faiss",
            "count": str(info["store"]["count"]),
            "prior": "none",
        }
        # keyboard only: the query box has focus on load; type, Enter
        assert page.evaluate("document.activeElement.id") == "q"
        page.keyboard.type("statins heart risk")
        page.keyboard.press("Enter")
        page.wait_for_selector("#hits > li")
        shown = read_bars(page)
        assert [h["id"] for h in shown] == [h["id"] for h in hits]
        solid, cos_rank = decomposition(hits)
        for pos, (h, s) in enumerate(zip(hits, shown, strict=True), start=1):
            assert s["score"] == f"{h['score']:.3f}"
            drawn = sum(seg["frac"] for seg in s["segs"] if seg["kind"] in ("base", "up", "offset"))
            assert drawn == pytest.approx(solid[pos - 1], abs=0.01), h["id"]
            assert drawn > 0
            delta = cos_rank[pos - 1] - pos
            want_badge = (
                f"▲ {delta} by magnitude"
                if delta > 0
                else f"▼ {-delta} by magnitude"
                if delta < 0
                else "same rank as cosine"
            )
            assert s["badge"] == want_badge
            assert (
                f"query norm {h['query_norm']:.3f} × document norm {h['doc_norm']:.3f}"
                in (s["label"])
            )
        # qnorm keeps document magnitude: some hit is not where cosine alone would put it
        assert any(b["badge"] != "same rank as cosine" for b in shown)
        # each ‖d‖ gauge: its text, fill and direction as page.js's rule gives them
        drawn_gauges = read_hits(page)
        for h, g, (text, fill, cls) in zip(hits, drawn_gauges, gauges(hits), strict=True):
            assert (g["gauge"], g["value"], g["fill_class"]) == ("‖d‖ vs mean", text, cls), h["id"]
            assert g["fill"] == pytest.approx(fill, abs=0.01), h["id"]
        assert any(g["value"] != "same" for g in drawn_gauges)
        status = page.text_content("#status")
        assert status.startswith("10 hits for “statins heart risk”")
        # Tab from the query box reaches the hits count, the button, then the first payload
        for _ in range(3):
            page.keyboard.press("Tab")
        assert page.evaluate("document.activeElement.tagName") == "SUMMARY"
        page.keyboard.press("Enter")
        payload = page.text_content("#hits > li:first-child details[open] pre")
        assert json.loads(payload) == hits[0]["payload"]
        assert no_horizontal_scroll(page)
        shot(page, tmp_path, "serve-search.png", full_page=True)

        # 400 px wide: readable, no horizontal scroll
        narrow = context.new_page()
        rec_narrow = Recorder(narrow)
        narrow.set_viewport_size({"width": 400, "height": 860})
        narrow.goto(server.url + "/")
        narrow.wait_for_selector('#ready[data-state="ready"]')
        narrow.fill("#q", "wing flow pressure")
        narrow.press("#q", "Enter")
        narrow.wait_for_selector("#hits > li")
        narrow.click("#hits > li:first-child summary")
        assert no_horizontal_scroll(narrow)
        font = narrow.evaluate(
            "parseFloat(getComputedStyle(document.querySelector('.snippet')).fontSize)"
        )
        assert font >= 13
        shot(narrow, tmp_path, "serve-search-400.png")

        # /docs: Swagger UI from the package, no request elsewhere
        docs = context.new_page()
        rec_docs = Recorder(docs)
        docs.goto(server.url + "/docs")
        docs.wait_for_selector("text=/search")
        assert docs.locator(".opblock").count() >= 6
        shot(docs, tmp_path, "serve-docs.png")

        # a store with a prior: the offset is drawn and the parts read m(d) and b(d); a title
        # is shown as text, never as markup (the /search answer is stood in for by the test)
        prior = context.new_page()
        rec_prior = Recorder(prior)
        fake = [
            (2.0, 0.8, 0.3, "<b>bold</b>"),
            (2.5, 0.7, -0.1, "second"),
            (1.5, 0.9, 0.0, "third"),
        ]
        fake_hits = [
            {
                "rank": i,
                "id": f"p{i}",
                "score": dn * cos + off,
                "doc_norm": dn,
                "cosine": cos,
                "query_norm": 1.0,
                "multiplier": dn,
                "offset": off,
                "payload": {"title": title, "text": "t"},
            }
            for i, (dn, cos, off, title) in enumerate(fake, start=1)
        ]
        body = json.dumps({"query": "prior", "truncated": False, "hits": fake_hits})
        prior.route(
            server.url + "/search",
            lambda route: route.fulfill(status=200, content_type="application/json", body=body),
        )
        prior.goto(server.url + "/")
        prior.fill("#q", "prior")
        prior.press("#q", "Enter")
        prior.wait_for_selector("#hits > li")
        bars = read_bars(prior)
        solid, _ = decomposition(fake_hits)
        for b, want in zip(bars, solid, strict=True):
            drawn = sum(seg["frac"] for seg in b["segs"] if seg["kind"] in ("base", "up", "offset"))
            assert drawn == pytest.approx(want, abs=0.01)
        assert [seg["kind"] for seg in bars[0]["segs"]][-1] == "offset"
        assert "offset-down" in [seg["kind"] for seg in bars[1]["segs"]]
        assert "+ offset 0.300" in bars[0]["label"]
        terms = prior.eval_on_selector_all(
            "#hits > li:first-child .parts dt", "ds => ds.map(d => d.textContent)"
        )
        assert terms == ["‖q‖", "m(d)", "cos θ", "b(d)", "score"]
        assert prior.text_content("#hits > li:first-child h3") == "<b>bold</b>"
        assert prior.locator("#hits b").count() == 0

        for r in (rec, rec_narrow, rec_docs, rec_prior):
            assert r.foreign(server.url) == [], r.foreign(server.url)
            assert r.errors == []
        urls = rec.urls()
        assert server.url + "/search" in urls and server.url + "/info" in urls
        assert any(u.endswith("/static/swagger/swagger-ui-bundle.js") for u in rec_docs.urls())
        context.close()
    finally:
        server.stop()


@pytest.mark.integration
def test_cosine_store_gauges_read_same_in_chromium(
    chromium, cosine_export, cosine_store, tmp_path
) -> None:
    """A cosine export's norms differ only by float32 rounding: every gauge is empty and reads
    "same", and the hits are said to be in cosine order."""
    store = tmp_path / "ix"
    shutil.copytree(cosine_store, store)
    server = start_server(cosine_export, "--store", f"faiss:{store}", key=None, log_dir=tmp_path)
    try:
        hits = server.post("/search", {"query": "statins heart risk", "k": 10}).json()["hits"]
        assert all(abs(h["doc_norm"] - 1) < 1e-5 for h in hits)
        context = chromium.new_context(viewport={"width": 1100, "height": 900})
        page = context.new_page()
        rec = Recorder(page)
        search_on_page(page, server.url, "statins heart risk")
        shown = read_hits(page)
        assert [s["id"] for s in shown] == [h["id"] for h in hits]
        for s in shown:
            assert (s["gauge"], s["value"], s["fill_class"]) == (
                "‖d‖ vs mean",
                "same",
                "gauge-fill",
            )
            assert s["fill"] == 0
            assert s["badge"] == "cosine order"
            assert s["terms"][1] == "‖d‖" and s["values"][1] == "1.000"
        status = page.text_content("#status")
        assert "every ‖d‖ is equal here: this export ranks by cosine" in status
        assert page.text_content('[data-fact="prior"]') == "none"
        assert rec.errors == [] and rec.foreign(server.url) == []
        context.close()
    finally:
        server.stop()


@pytest.mark.integration
def test_prior_store_is_labelled_as_the_prior_in_chromium(
    chromium, cosine_export, hub_store, hub_csls_store, tmp_path
) -> None:
    """On a cosine export given a prior by `magretrieve rescale --prior-file`, m(d) and b(d)
    are the prior's (named with its parameters from /info), and so are the rank moves."""
    cases = [
        (hub_store, "hub", "hub (beta=1, k=3)", "a multiplier m(d)", ["prior hub"]),
        (
            hub_csls_store,
            "hub + csls",
            "hub (beta=1, k=3) + csls (alpha=0.5, k=3, bank=corpus)",
            "a multiplier m(d) and an offset b(d)",
            ["prior hub", "prior csls"],
        ),
    ]
    context = chromium.new_context(viewport={"width": 1100, "height": 900})
    for n, (built, name, label, sets, named) in enumerate(cases):
        terms = ["‖q‖", named[0], "cos θ", *named[1:], "score"]
        store = tmp_path / f"ix{n}"
        shutil.copytree(built, store)
        server = start_server(
            cosine_export, "--store", f"faiss:{store}", key=None, log_dir=tmp_path
        )
        try:
            hits = server.post("/search", {"query": "statins heart risk", "k": 10}).json()["hits"]
            page = context.new_page()
            rec = Recorder(page)
            search_on_page(page, server.url, "statins heart risk")
            assert page.text_content('[data-fact="mode"]') == "cosine"
            shown = read_hits(page)
            assert [s["id"] for s in shown] == [h["id"] for h in hits]
            badges = want_badges(hits, "by prior")
            assert any(b != "same rank as cosine" for b in badges)
            for h, s, badge, (text, fill, cls) in zip(
                hits, shown, badges, gauges(hits), strict=True
            ):
                assert s["terms"] == terms, h["id"]
                assert s["values"][1] == f"×{h['doc_norm']:.3f}"
                assert f"× prior hub multiplier {h['doc_norm']:.3f} ×" in s["label"]
                if "prior csls" in terms:
                    sign = "−" if h["offset"] < 0 else "+"
                    assert s["values"][3] == f"{sign}{abs(h['offset']):.3f}"
                    assert f"+ prior csls offset {h['offset']:.3f}" in s["label"]
                assert s["badge"] == badge
                assert (s["gauge"], s["value"], s["fill_class"]) == ("prior hub vs mean", text, cls)
                assert s["fill"] == pytest.approx(fill, abs=0.01)
            # nothing on the page calls the prior's doing magnitude
            hits_text = page.text_content("#hits")
            assert "magnitude" not in hits_text and "‖d‖" not in hits_text
            assert page.text_content('[data-fact="prior"]') == name
            assert page.text_content("#prior") == f"document prior {label}: {sets} on cosine"
            assert page.text_content('[data-legend="badge"]') == "▲ 2 by prior"
            assert "prior hub" in page.text_content('[data-legend="up"]')
            status = page.text_content("#status")
            assert f"the prior {label} moved" in status
            assert no_horizontal_scroll(page)
            page.screenshot(path=str(tmp_path / f"prior-{n}.png"), full_page=True)
            page.set_viewport_size({"width": 400, "height": 860})  # the longest label fits too
            assert no_horizontal_scroll(page)
            assert rec.errors == [] and rec.foreign(server.url) == []
            page.close()
        finally:
            server.stop()
    context.close()


@pytest.mark.integration
def test_keyed_page_reaches_the_api_docs_in_chromium(
    chromium, export_dir, store_dir, tmp_path
) -> None:
    """On a keyed server the page's "API docs" link opens Swagger UI (not a JSON 401), which
    gets the key the page holds, so "Try it out" answers 200; opened alone, /docs loads too
    and asks for the key through Authorize."""
    store = tmp_path / "ix"
    shutil.copytree(store_dir, store)
    server = start_server(export_dir, "--store", f"faiss:{store}", key=KEY, log_dir=tmp_path)
    try:
        # what the link points at answers without the key (a page, not a JSON 401)
        link = httpx.get(server.url + "/docs")
        assert link.status_code == 200, link.text
        assert link.headers["content-type"].startswith("text/html")
        assert httpx.get(server.url + "/openapi.json").json()["info"]["title"] == "magretrieve"
        context = chromium.new_context(viewport={"width": 1100, "height": 900})
        page = context.new_page()
        rec = Recorder(page)
        page.goto(server.url + "/")
        page.wait_for_selector("#key-form:not([hidden])")
        page.fill("#key", KEY)
        page.press("#key", "Enter")
        with context.expect_page() as opened:
            page.click("footer a[href='docs']")
        docs = opened.value
        rec_docs = Recorder(docs)
        docs.wait_for_load_state()
        assert docs.url == server.url + "/docs"
        assert docs.evaluate("document.contentType") == "text/html"
        assert docs.title() == "magretrieve API docs"
        docs.wait_for_selector(".btn.authorize.locked")  # authorized with the page's key
        op = docs.locator(".opblock-post", has=docs.locator('[data-path="/search"]'))
        op.locator(".opblock-summary").click()
        op.locator(".try-out__btn").click()
        op.locator("textarea.body-param__text").fill('{"query": "statins heart risk", "k": 3}')
        op.locator(".execute").click()
        status = op.locator(".live-responses-table tr.response .response-col_status").first
        status.wait_for()
        assert status.text_content().strip() == "200"
        searches = [r for r in rec_docs.requests if r.url == server.url + "/search"]
        assert [r.headers.get("authorization") for r in searches] == [f"Bearer {KEY}"]
        body = op.locator(".live-responses-table tr.response .response-col_description pre").first
        assert len(json.loads(body.text_content())["hits"]) == 3
        # the key went from tab to tab in memory only
        for tab in (page, docs):
            assert KEY not in tab.url
            assert tab.evaluate("localStorage.length + sessionStorage.length") == 0
        assert context.cookies() == []
        assert rec.foreign(server.url) == [] and rec_docs.foreign(server.url) == []
        assert rec.errors == [] and rec_docs.errors == []
        docs.screenshot(path=str(tmp_path / "docs-key.png"))

        # /docs opened alone: the page and its schema load; Authorize waits for the key
        alone = context.new_page()
        answer = alone.goto(server.url + "/docs")
        assert answer.status == 200
        alone.wait_for_selector(".btn.authorize.unlocked")
        assert alone.locator(".opblock").count() >= 6
        context.close()
    finally:
        server.stop()


@pytest.mark.integration
def test_api_key_flow_in_chromium(chromium, export_dir, store_dir, tmp_path) -> None:
    store = tmp_path / "ix"
    shutil.copytree(store_dir, store)
    server = start_server(export_dir, "--store", f"faiss:{store}", key=KEY, log_dir=tmp_path)
    try:
        context = chromium.new_context(viewport={"width": 1000, "height": 800})
        page = context.new_page()
        rec = Recorder(page)
        page.goto(server.url + "/")  # the page itself needs no key
        page.wait_for_selector("#key-form:not([hidden])")
        assert page.evaluate("document.activeElement.id") == "key"
        # a query before the key: nothing is sent, the page asks for the key
        page.fill("#q", "statins heart risk")
        page.press("#q", "Enter")
        assert "API key" in page.text_content("#status")
        assert page.evaluate("document.activeElement.id") == "key"
        assert not [u for u in rec.urls() if u.endswith("/search")]
        # a wrong key: the server refuses, the page asks again
        page.keyboard.type("wrong-key")
        page.keyboard.press("Enter")
        page.press("#q", "Enter")
        page.locator("#status", has_text="refused").wait_for()
        assert page.is_visible("#key-form")
        # the right key, typed and entered with the keyboard
        page.focus("#key")
        page.keyboard.type(KEY)
        page.keyboard.press("Enter")
        assert page.input_value("#key") == ""  # not left in the DOM
        page.press("#q", "Enter")
        page.wait_for_selector("#hits > li")
        assert len(read_bars(page)) == 10
        shot(page, tmp_path, "serve-search-key.png")

        searches = [r for r in rec.requests if r.url.endswith("/search")]
        assert len(searches) == 2
        assert searches[0].headers["authorization"] == "Bearer wrong-key"
        assert searches[1].headers["authorization"] == f"Bearer {KEY}"
        # never in the URL, a cookie or web storage
        assert all(KEY not in u for u in rec.urls()) and KEY not in page.url
        assert context.cookies() == []
        assert page.evaluate("localStorage.length + sessionStorage.length") == 0
        assert rec.foreign(server.url) == []
        # the only console error is the browser's note of the refused (401) search
        assert all("401" in e for e in rec.errors), rec.errors
        context.close()
    finally:
        server.stop()


@pytest.mark.integration
def test_diagnose_html_opens_from_disk_in_chromium(
    chromium, tiny_model_dir, tiny_beir_dir, tmp_path
) -> None:
    from magretrieve.cli import main
    from magretrieve.data.readers import load_beir
    from magretrieve.train.encoder import Encoder
    from magretrieve.train.trainer import TrainConfig, train

    run = tmp_path / "run"
    enc = Encoder.load(tiny_model_dir, "learnable")
    train(
        enc,
        load_beir(f"{tiny_beir_dir}:train").training_pairs(),
        TrainConfig(epochs=1, batch_size=3, max_steps=4),
        out_dir=run,
        progress=False,
    )
    sts = tmp_path / "sts.jsonl"
    sts.write_text(
        "".join(
            json.dumps(
                {
                    "sentence1": f"statins heart risk {i}",
                    "sentence2": f"cancer cell {i % 3}",
                    "score": i % 5,
                }
            )
            + "\n"
            for i in range(12)
        )
    )
    out = tmp_path / "report"
    args = ["diagnose", "--model", str(run), "--data", f"{tiny_beir_dir}:train", "--sts", str(sts)]
    args += ["--out", str(out), "--probe-steps", "2", "--probe-batch-size", "3"]
    args += ["--fisher-batches", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    html_path = out / "diagnose.html"
    assert f"{html_path}" in result.stdout
    report = json.loads((out / "diagnose.json").read_text())
    assert report["html"] == str(html_path)

    # alone in another folder: nothing beside it is needed
    alone = tmp_path / "elsewhere" / "diagnose.html"
    alone.parent.mkdir()
    shutil.copyfile(html_path, alone)
    context = chromium.new_context(viewport={"width": 1000, "height": 900})
    page = context.new_page()
    rec = Recorder(page)
    page.goto(alone.as_uri())
    page.wait_for_load_state("load")
    images = page.evaluate(
        "() => [...document.images].map(i => ({w: i.naturalWidth, h: i.naturalHeight,"
        " done: i.complete, src: i.src.slice(0, 22)}))"
    )
    assert len(images) == len(report["plots"]) >= 5
    for img in images:
        assert img["done"] and img["w"] > 0 and img["h"] > 0, img
        assert img["src"] == "data:image/png;base64,"
    assert [u for u in rec.urls() if not u.startswith(("file://", "data:"))] == []
    assert rec.errors == []
    headline = page.text_content(".verdict .mode")
    assert headline.startswith("Recommended: " + report["recommendation"]["mode"])
    # the verdict is the first section, before any figure
    order = page.evaluate(
        "() => [...document.querySelectorAll('main > section, main img')].map(e => e.tagName)"
    )
    assert order[0] == "SECTION" and order.index("IMG") > 0
    assert no_horizontal_scroll(page)
    shot(page, tmp_path, "diagnose-report.png", full_page=True)
    context.close()
