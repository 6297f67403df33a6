// magretrieve search page: reads /info and /ready, posts /search, draws each score as its parts.
// Same-origin requests only (relative URLs); the API key lives in a variable of this script,
// never in the URL, a cookie or web storage (it reaches /docs tabs this page opens by
// postMessage, to this origin only). Text from the server is set with textContent.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const keyRequired = document.body.dataset.keyRequired === "true";
  // Below this relative difference two norms (or two prior multipliers) read as the same.
  // Scores are printed with three decimals, so a 0.1 % difference in a factor of the score
  // is at most one unit of the last printed digit; it is also far above the rounding of
  // float32 vectors (a unit vector's norm is 1 ± ~1e-7) and of quantized stores, so a cosine
  // export reads "same" everywhere instead of magnifying rounding noise to full bars.
  const SAME = 1e-3;
  // A gauge's full half-width is the largest deviation among the hits, but never less than
  // ten times SAME: differences just above the floor draw as slivers, not as full bars.
  const MIN_SPAN = 10 * SAME;
  const DOCS_READY = "magretrieve-docs-ready";
  const DOCS_KEY = "magretrieve-key";
  let apiKey = null;
  let busy = false;
  let prior = null; // the store's document prior, from /info (null: none)
  const docsTabs = []; // /docs tabs this page opened (they may ask for the key)

  function el(tag, className, text) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = String(text);
    return node;
  }

  function num(x, digits) {
    if (typeof x !== "number" || !Number.isFinite(x)) return "–";
    const d = digits === undefined ? 3 : digits;
    return Math.abs(x) >= 1000 ? x.toFixed(0) : x.toFixed(d);
  }

  function setStatus(text, kind) {
    const status = $("status");
    status.textContent = text;
    if (kind) status.dataset.kind = kind;
    else delete status.dataset.kind;
  }

  // ------------------------------------------------------------------ facts and readiness

  function fact(name, value) {
    const dd = document.querySelector(`[data-fact="${name}"]`);
    if (dd) dd.textContent = value === null || value === undefined ? "–" : String(value);
  }

  async function loadInfo() {
    try {
      const resp = await fetch("info", { headers: { Accept: "application/json" } });
      if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
      const info = await resp.json();
      fact("mode", info.mode);
      fact("gamma_q", num(info.gamma_q, 2));
      fact("gamma_d", num(info.gamma_d, 2));
      fact("dimension", info.dimension);
      fact("store", info.store ? info.store.kind : "none");
      fact("count", info.store ? info.store.count.toLocaleString("en") : "–");
      prior = (info.store && info.store.prior) || null;
      fact("prior", info.store ? (prior ? (prior.parts || [prior]).map((p) => p.name).join(" + ") : "none") : "–");
      if (prior) {
        const terms = [prior.multiplier ? "a multiplier m(d)" : "", prior.offset ? "an offset b(d)" : ""];
        $("prior").textContent = `document prior ${priorText()}: ${terms.filter(Boolean).join(" and ") || "no term"} on cosine`;
        describePrior();
      }
      const bits = [];
      if (info.model_id) bits.push(`model ${info.model_id}`);
      if (info.runtime) bits.push(`runtime ${info.runtime}`);
      if (info.quantization) bits.push(`quantization ${info.quantization}`);
      $("model").textContent = bits.join(" · ");
      if (!info.store) {
        setStatus("This server has no store: start it with --store SPEC to search.", "error");
        $("go").disabled = true;
      }
    } catch (err) {
      setStatus(`Could not read /info: ${err.message}`, "error");
    }
  }

  async function loadReady() {
    const node = $("ready");
    try {
      const resp = await fetch("ready", { headers: { Accept: "application/json" } });
      node.dataset.state = resp.ok ? "ready" : "not-ready";
      node.textContent = resp.ok ? "ready" : "not ready";
    } catch (err) {
      node.dataset.state = "not-ready";
      node.textContent = "unreachable";
    }
  }

  /** The prior with its chosen parameters, e.g. "hub (beta=0.05, k=10)"; parts joined by "+". */
  function priorText() {
    return (prior.parts || [prior])
      .map((p) => {
        const params = Object.entries(p.params || {}).map(([k, v]) => `${k}=${v}`);
        return params.length ? `${p.name} (${params.join(", ")})` : p.name;
      })
      .join(" + ");
  }

  /** Names of the prior's parts that set a term ("multiplier" or "offset"). */
  function termOf(term) {
    const parts = prior.parts || [prior];
    const names = parts.filter((p) => p[term]).map((p) => p.name);
    return `prior ${names.length ? names.join("+") : prior.name}`;
  }

  /** The legend of a store with a prior: its multiplier and offset, not a magnitude. */
  function describePrior() {
    const says = (name, text) => {
      const node = document.querySelector(`[data-legend="${name}"]`);
      if (node) node.textContent = text;
    };
    if (prior.multiplier) {
      const mult = termOf("multiplier");
      says("base", `cosine, at the hits' mean ${mult} multiplier`);
      says("up", `${mult} added (its multiplier m(d) above the hits' mean)`);
      says("down", `${mult} taken away (m(d) below the mean)`);
      says("gauge", `The thin bar under it shows the ${mult} multiplier m(d) against the hits' mean: to the right in green above it, to the left in red below it.`);
    }
    if (prior.offset) says("offset", `${termOf("offset")} offset b(d)`);
    says("badge", "▲ 2 by prior");
  }

  // ------------------------------------------------------------------ the API key

  function askForKey(message) {
    const form = $("key-form");
    form.hidden = false;
    if (message) setStatus(message, "error");
    $("key").focus();
  }

  function useKey(event) {
    event.preventDefault();
    const input = $("key");
    const value = input.value.trim();
    if (!value) {
      askForKey("Enter the API key.");
      return;
    }
    apiKey = value;
    input.value = ""; // the key stays in this script's memory only
    input.placeholder = "key set for this tab";
    setStatus("Key set for this tab. Type a query.");
    $("q").focus();
  }

  // ------------------------------------------------------------------ /docs with the key

  /** Open /docs in a new tab when this tab holds a key, so "Try it out" can send it. */
  function openDocs(event) {
    if (!apiKey || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
    const tab = window.open(event.currentTarget.href, "_blank");
    if (!tab) return; // a blocked pop-up: the link opens /docs here, without the key
    event.preventDefault();
    docsTabs.push(tab);
  }

  /** A /docs tab this page opened says it is ready: hand it the key, to this origin only. */
  function answerDocs(event) {
    if (event.origin !== window.location.origin || !docsTabs.includes(event.source)) return;
    if (!event.data || event.data.type !== DOCS_READY || !apiKey) return;
    event.source.postMessage({ type: DOCS_KEY, key: apiKey }, window.location.origin);
  }

  // ------------------------------------------------------------------ search

  async function search(event) {
    event.preventDefault();
    if (busy) return;
    const query = $("q").value.trim();
    if (!query) {
      setStatus("Type a query first.", "error");
      $("q").focus();
      return;
    }
    if (keyRequired && !apiKey) {
      askForKey("This server needs its API key: enter it first.");
      return;
    }
    const k = Number($("k").value);
    const headers = { "Content-Type": "application/json", Accept: "application/json" };
    if (apiKey) headers.Authorization = `Bearer ${apiKey}`;
    busy = true;
    $("go").disabled = true;
    setStatus("Searching…");
    const started = performance.now();
    try {
      const resp = await fetch("search", {
        method: "POST",
        headers,
        body: JSON.stringify({ query, k }),
        credentials: "omit",
      });
      const body = await resp.json().catch(() => null);
      const message = body && body.error ? body.error.message : `HTTP ${resp.status}`;
      if (resp.status === 401) {
        apiKey = null;
        askForKey(`The server refused the key: ${message}`);
        return;
      }
      if (!resp.ok) {
        setStatus(`Search failed (${resp.status}): ${message}`, "error");
        return;
      }
      render(body, performance.now() - started);
    } catch (err) {
      setStatus(`The server did not answer: ${err.message}`, "error");
    } finally {
      busy = false;
      $("go").disabled = false;
    }
  }

  // ------------------------------------------------------------------ drawing a result

  /** Split each score into cosine at the hits' mean norm, the magnitude's part and the offset. */
  function decompose(hits) {
    const mean = hits.reduce((s, h) => s + h.doc_norm, 0) / hits.length;
    const byCosine = hits.slice().sort((a, b) => b.cosine - a.cosine || a.rank - b.rank);
    const cosineRank = new Map(byCosine.map((h, i) => [h, i + 1]));
    const rows = hits.map((h, i) => {
      const base = h.query_norm * mean * h.cosine;
      const magnitude = h.query_norm * (h.doc_norm - mean) * h.cosine;
      const positive = [
        ["base", Math.max(base, 0)],
        ["up", Math.max(magnitude, 0)],
        ["offset", Math.max(h.offset, 0)],
      ];
      const negative = [
        ["down", Math.max(-magnitude, 0)],
        ["offset-down", Math.max(-h.offset, 0)],
      ];
      const extent = positive.reduce((s, p) => s + p[1], 0);
      return { hit: h, position: i + 1, cosineRank: cosineRank.get(h), positive, negative, extent };
    });
    const scale = Math.max(...rows.map((r) => r.extent), 1e-12);
    return { rows, mean, scale };
  }

  /** Bar segments: positive parts up to the score, then what the negative parts took away. */
  function bar(row, scale) {
    const node = el("div", "bar");
    let room = Math.max(row.hit.score, 0);
    for (const [kind, value] of row.positive) {
      const shown = Math.min(value, room);
      room -= shown;
      if (shown > 0) node.append(segment(kind, shown, scale));
    }
    const lost = Math.max(row.extent - Math.max(row.hit.score, 0), 0);
    const negatives = row.negative.reduce((s, n) => s + n[1], 0);
    for (const [kind, value] of row.negative) {
      if (value > 0 && negatives > 0) node.append(segment(kind, (lost * value) / negatives, scale));
    }
    return node;
  }

  function segment(kind, value, scale) {
    const seg = el("span", `seg ${kind}`);
    seg.style.width = `${Math.max((100 * value) / scale, 0).toFixed(3)}%`;
    return seg;
  }

  /** ‖d‖ (or the prior's m(d)) against the hits' mean, a bar from the centre: right above
   *  it, left below it; empty and "same" within SAME of the mean. */
  function normGauge(norm, mean, span, label) {
    const wrap = el("div", "gauge");
    const rel = mean > 0 ? (norm - mean) / mean : 0;
    const same = Math.abs(rel) < SAME;
    wrap.append(el("span", "gauge-label", `${label} vs mean`));
    const track = el("span", "gauge-track");
    const fill = el("span", same ? "gauge-fill" : `gauge-fill ${rel > 0 ? "up" : "down"}`);
    fill.style.width = same ? "0%" : `${Math.min((50 * Math.abs(norm - mean)) / span, 50).toFixed(3)}%`;
    track.append(fill);
    track.setAttribute("aria-hidden", "true");
    const text = same ? "same" : `${rel > 0 ? "+" : "−"}${(100 * Math.abs(rel)).toFixed(1)} %`;
    wrap.append(track, el("span", "gauge-value num", text));
    return wrap;
  }

  function signed(x) {
    return x < 0 ? `−${num(-x)}` : `+${num(x)}`;
  }

  function part(name, value, className) {
    const wrap = el("div", className);
    wrap.append(el("dt", null, name), el("dd", "num", value));
    return wrap;
  }

  function snippet(text, limit) {
    const flat = String(text || "").replace(/\s+/g, " ").trim();
    return flat.length > limit ? `${flat.slice(0, limit - 1).trimEnd()}…` : flat;
  }

  function render(result, ms) {
    const list = $("hits");
    list.replaceChildren();
    const hits = result.hits || [];
    const cut = result.truncated ? " (the query was cut at the export's max length)" : "";
    if (!hits.length) {
      setStatus(`No hits for “${result.query}”${cut}.`);
      return;
    }
    const { rows, mean, scale } = decompose(hits);
    const spread = Math.max(...hits.map((h) => h.doc_norm)) - Math.min(...hits.map((h) => h.doc_norm));
    const anyOffset = hits.some((h) => h.offset !== 0);
    const flat = spread < SAME * Math.max(mean, 1e-12) && !anyOffset;
    const maxDev = Math.max(...hits.map((h) => Math.abs(h.doc_norm - mean)), 1e-12);
    const span = Math.max(maxDev, MIN_SPAN * mean);
    // with a prior, every move away from cosine order is the prior's (its store is cosine)
    const mover = prior ? "by prior" : "by magnitude";
    const scaled = prior && prior.multiplier ? termOf("multiplier") : null;
    const added = prior && prior.offset ? termOf("offset") : null;
    let moved = 0;
    for (const row of rows) {
      const h = row.hit;
      const item = el("li", "hit");
      const head = el("div", "hit-head");
      const title = h.payload && h.payload.title ? h.payload.title : h.id;
      head.append(el("span", "rank", h.rank), el("h3", null, title), el("code", "id", h.id));
      const delta = row.cosineRank - row.position;
      let badge;
      if (flat) badge = el("span", "badge", "cosine order");
      else if (delta > 0) badge = el("span", "badge up", `▲ ${delta} ${mover}`);
      else if (delta < 0) badge = el("span", "badge down", `▼ ${-delta} ${mover}`);
      else badge = el("span", "badge", "same rank as cosine");
      if (!flat && delta > 0) moved += 1;
      head.append(badge, el("span", "score num", num(h.score)));
      item.append(head);
      const text = h.payload ? h.payload.text : "";
      if (text) item.append(el("p", "snippet", snippet(text, 280)));

      const factor = scaled ? `${scaled} multiplier` : "document norm";
      const formula =
        `score ${num(h.score)} = query norm ${num(h.query_norm)} × ${factor} ${num(h.doc_norm)}` +
        ` × cosine ${num(h.cosine)}` +
        (anyOffset ? ` + ${added ? `${added} offset` : "offset"} ${num(h.offset)}` : "");
      const drawn = bar(row, scale);
      drawn.setAttribute("role", "img");
      drawn.setAttribute("aria-label", formula);
      item.append(drawn);

      item.append(normGauge(h.doc_norm, mean, span, scaled || "‖d‖"));

      const parts = el("dl", "parts");
      parts.append(
        part("‖q‖", num(h.query_norm)),
        scaled ? part(scaled, `×${num(h.doc_norm)}`) : part(anyOffset ? "m(d)" : "‖d‖", num(h.doc_norm)),
        part("cos θ", num(h.cosine)),
      );
      if (added) parts.append(part(added, signed(h.offset)));
      else if (anyOffset) parts.append(part("b(d)", num(h.offset)));
      parts.append(part("score", num(h.score), "eq"));
      item.append(parts);

      const details = el("details", "payload");
      details.append(el("summary", null, `payload of ${h.id}`), el("pre", null, JSON.stringify(h.payload, null, 2)));
      item.append(details);
      list.append(item);
    }
    let why;
    if (prior) {
      why = flat
        ? `the prior ${priorText()} gives these hits the same multiplier: they rank by cosine`
        : `the prior ${priorText()} moved ${moved} of ${hits.length} hits up from their cosine rank`;
    } else {
      why = flat
        ? "every ‖d‖ is equal here: this export ranks by cosine"
        : `magnitude moved ${moved} of ${hits.length} hits up from their cosine rank`;
    }
    setStatus(`${hits.length} hits for “${result.query}” in ${Math.round(ms)} ms; ${why}${cut}.`);
  }

  // ------------------------------------------------------------------ start

  $("search-form").addEventListener("submit", search);
  $("key-form").addEventListener("submit", useKey);
  $("docs-link").addEventListener("click", openDocs);
  window.addEventListener("message", answerDocs);
  if (keyRequired) askForKey();
  else $("q").focus();
  loadInfo();
  loadReady();
})();
