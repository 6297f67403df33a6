// magretrieve search page: reads /info and /ready, posts /search, draws each score as its parts.
// Same-origin requests only (relative URLs); the API key lives in a variable of this script,
// never in the URL, a cookie or web storage. Text from the server is set with textContent.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const keyRequired = document.body.dataset.keyRequired === "true";
  let apiKey = null;
  let busy = false;

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

  /** ‖d‖ against the hits' mean, a bar from the centre: right above it, left below it. */
  function normGauge(norm, mean, maxDev) {
    const wrap = el("div", "gauge");
    const rel = mean > 0 ? (100 * (norm - mean)) / mean : 0;
    const sign = rel >= 0 ? "+" : "−";
    wrap.append(el("span", "gauge-label", "‖d‖ vs mean"));
    const track = el("span", "gauge-track");
    const fill = el("span", `gauge-fill ${norm >= mean ? "up" : "down"}`);
    fill.style.width = `${((50 * Math.abs(norm - mean)) / maxDev).toFixed(3)}%`;
    track.append(fill);
    track.setAttribute("aria-hidden", "true");
    wrap.append(track, el("span", "gauge-value num", `${sign}${Math.abs(rel).toFixed(1)} %`));
    return wrap;
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
    const flat = spread <= 1e-6 * Math.max(mean, 1e-12) && !anyOffset;
    const maxDev = Math.max(...hits.map((h) => Math.abs(h.doc_norm - mean)), 1e-12);
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
      else if (delta > 0) badge = el("span", "badge up", `▲ ${delta} by magnitude`);
      else if (delta < 0) badge = el("span", "badge down", `▼ ${-delta} by magnitude`);
      else badge = el("span", "badge", "same rank as cosine");
      if (!flat && delta > 0) moved += 1;
      head.append(badge, el("span", "score num", num(h.score)));
      item.append(head);
      const text = h.payload ? h.payload.text : "";
      if (text) item.append(el("p", "snippet", snippet(text, 280)));

      const formula =
        `score ${num(h.score)} = query norm ${num(h.query_norm)} × document norm ${num(h.doc_norm)}` +
        ` × cosine ${num(h.cosine)}` + (anyOffset ? ` + offset ${num(h.offset)}` : "");
      const drawn = bar(row, scale);
      drawn.setAttribute("role", "img");
      drawn.setAttribute("aria-label", formula);
      item.append(drawn);

      item.append(normGauge(h.doc_norm, mean, maxDev));

      const parts = el("dl", "parts");
      parts.append(
        part("‖q‖", num(h.query_norm)),
        part(anyOffset ? "m(d)" : "‖d‖", num(h.doc_norm)),
        part("cos θ", num(h.cosine)),
      );
      if (anyOffset) parts.append(part("b(d)", num(h.offset)));
      parts.append(part("score", num(h.score), "eq"));
      item.append(parts);

      const details = el("details", "payload");
      details.append(el("summary", null, `payload of ${h.id}`), el("pre", null, JSON.stringify(h.payload, null, 2)));
      item.append(details);
      list.append(item);
    }
    const why = flat
      ? "every ‖d‖ is equal here: this export ranks by cosine"
      : `magnitude moved ${moved} of ${hits.length} hits up from their cosine rank`;
    setStatus(`${hits.length} hits for “${result.query}” in ${Math.round(ms)} ms; ${why}${cut}.`);
  }

  // ------------------------------------------------------------------ start

  $("search-form").addEventListener("submit", search);
  $("key-form").addEventListener("submit", useKey);
  if (keyRequired) askForKey();
  else $("q").focus();
  loadInfo();
  loadReady();
})();
