/* CRATE explorer: plain JavaScript, no framework, no network. Reads the JSON payload in #xp-data
   (built by crate_transformer.analysis.explorer) and draws attention, PCA colours and MaskCut masks. */
(function () {
  "use strict";
  var section = document.getElementById("xp-explorer");
  var P = JSON.parse(document.getElementById("xp-data").textContent);
  var root = document.getElementById("xp-root");
  var nl = P.layers.length, K = P.heads, cmap = P.colormap;
  var state = { item: 0, layer: nl - 1, head: 0, query: -1, alpha: 0.7, pca: false, masks: false, noself: false,
    truth: !!P.truth };

  function bytes(s) {
    var b = atob(s), a = new Uint8Array(b.length);
    for (var i = 0; i < b.length; i++) a[i] = b.charCodeAt(i);
    return a;
  }
  function el(tag, attrs, parent, text) {
    var e = document.createElement(tag);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function control(parent, label, input) {
    var l = el("label", {}, parent, label + " ");
    l.appendChild(input);
    return input;
  }
  function select(parent, id, label, names, value, key) {
    var s = el("select", { id: id });
    names.forEach(function (name, i) { el("option", { value: String(i) }, s, name); });
    s.value = String(value);
    s.addEventListener("change", function () { state[key] = parseInt(s.value, 10); draw(); });
    return control(parent, label, s);
  }
  function checkbox(parent, id, label, key) {
    var c = el("input", { id: id, type: "checkbox" });
    c.addEventListener("change", function () { state[key] = c.checked; draw(); });
    return control(parent, label, c);
  }
  function rgb(c, a) { return "rgba(" + c[0] + "," + c[1] + "," + c[2] + "," + a + ")"; }
  function argmax(a, off, n) {
    var best = 0;
    for (var j = 1; j < n; j++) if (a[off + j] > a[off + best]) best = j;
    return best;
  }

  var A = bytes(P.attention);
  var bar = el("div", { class: "xp-controls" }, root);
  select(bar, "xp-item", P.kind === "image" ? "image" : "text", P.captions, 0, "item");
  select(bar, "xp-layer", "layer", P.layers.map(function (l) { return "layer " + l + " of " + P.depth; }),
    nl - 1, "layer");
  select(bar, "xp-head", "head", Array.from({ length: K }, function (_, k) { return "head " + (k + 1); }), 0, "head");
  var status;
  var draw = P.kind === "image" ? imageView() : textView();

  function imageView() {
    var h = P.grid[0], w = P.grid[1], N = h * w;
    var cell = Math.max(4, Math.floor(320 / Math.max(h, w))), W = cell * w, H = cell * h;
    var PCA = bytes(P.pca), M = bytes(P.masks);
    var alpha = el("input", { id: "xp-alpha", type: "range", min: "0", max: "100", value: "70" });
    control(bar, "overlay opacity", alpha).addEventListener("input", function () {
      state.alpha = parseInt(alpha.value, 10) / 100; draw();
    });
    checkbox(bar, "xp-noself", "hide the query's own patch", "noself");
    checkbox(bar, "xp-pca", "PCA colours", "pca");
    checkbox(bar, "xp-masks", "MaskCut masks", "masks");
    var T = P.truth ? bytes(P.truth) : null;
    if (T) checkbox(bar, "xp-truth", "ground-truth outline", "truth").checked = true;
    status = el("div", { id: "xp-status" }, root);
    var panels = el("div", { class: "xp-panels" }, root);
    function panel(id, caption) {
      var f = el("figure", {}, panels);
      var c = el("canvas", { id: id, width: String(W), height: String(H), "data-grid": h + "x" + w }, f);
      el("figcaption", {}, f, caption);
      c.addEventListener("mousemove", function (e) {
        var r = c.getBoundingClientRect();
        var col = Math.min(w - 1, Math.floor((e.clientX - r.left) / r.width * w));
        var row = Math.min(h - 1, Math.floor((e.clientY - r.top) / r.height * h));
        var q = Math.max(0, row) * w + Math.max(0, col);
        if (q !== state.query) { state.query = q; draw(); }
      });
      c.addEventListener("mouseleave", function () { state.query = -1; draw(); });
      return c;
    }
    var ca = panel("xp-attn", "attention of the hovered patch (class token when none) over the patches");
    var cs = panel("xp-seg", "input, PCA colours (RGB = PC1-3) and MaskCut masks of this layer's features" +
      (P.truth ? "; yellow: the outline of the ground truth" : ""));
    var images = P.images.map(function (src) { var im = new Image(); im.src = src; return im; });
    var loaded = 0;
    images.forEach(function (im) {
      im.onload = function () { if (++loaded === images.length) { draw(); section.setAttribute("data-ready", "1"); } };
    });

    // MSSA shares query and key: a token's score with itself, |U_k^T z|^2, is usually the largest, so the other
    // patches are shown relative to the largest of them (the query's own patch is drawn at zero).
    function rescaleWithout(row, q) {
      var out = new Uint8Array(row.length), peak = 0, j;
      for (j = 0; j < row.length; j++) if (j !== q && row[j] > peak) peak = row[j];
      for (j = 0; j < row.length; j++) out[j] = j === q ? 0 : Math.round(255 * row[j] / Math.max(peak, 1));
      return out;
    }
    function base(ctx) {
      ctx.imageSmoothingEnabled = false;
      ctx.clearRect(0, 0, W, H);
      ctx.drawImage(images[state.item], 0, 0, W, H);
    }
    // the ground truth's outline: the pixels of an instance with a 4-neighbour of another label (or the image
    // border), drawn at the canvas scale over the predicted masks; returns how many it drew (data-truth, for tests)
    function truthOutline(ctx) {
      if (!T || !state.truth) return 0;
      var th = P.truth_size[0], tw = P.truth_size[1], off = state.item * th * tw, sx = W / tw, sy = H / th;
      var drawn = 0, y, x, v;
      function at(yy, xx) { return yy < 0 || xx < 0 || yy >= th || xx >= tw ? -1 : T[off + yy * tw + xx]; }
      ctx.fillStyle = "#ffeb3b";
      for (y = 0; y < th; y++) {
        for (x = 0; x < tw; x++) {
          v = at(y, x);
          if (v > 0 && (at(y - 1, x) !== v || at(y + 1, x) !== v || at(y, x - 1) !== v || at(y, x + 1) !== v)) {
            ctx.fillRect(x * sx, y * sy, Math.max(1, sx), Math.max(1, sy));
            drawn++;
          }
        }
      }
      return drawn;
    }
    function outline(ctx) {
      if (state.query < 0) return;
      ctx.strokeStyle = "#00e5ff"; ctx.lineWidth = 2;
      ctx.strokeRect((state.query % w) * cell + 1, Math.floor(state.query / w) * cell + 1, cell - 2, cell - 2);
    }
    return function () {
      if (loaded < images.length) return;
      var off = ((((state.item * nl + state.layer) * K + state.head) * (N + 1)) + state.query + 1) * N;
      var ctx = ca.getContext("2d"), j, c, row = A.subarray(off, off + N);
      if (state.noself && state.query >= 0) row = rescaleWithout(row, state.query);
      base(ctx);
      for (j = 0; j < N; j++) {
        ctx.fillStyle = rgb(cmap[row[j]], state.alpha);
        ctx.fillRect((j % w) * cell, Math.floor(j / w) * cell, cell, cell);
      }
      outline(ctx);
      var seg = cs.getContext("2d"), so = (state.item * nl + state.layer) * N;
      base(seg);
      for (j = 0; j < N; j++) {
        var x = (j % w) * cell, y = Math.floor(j / w) * cell;
        if (state.pca) {
          seg.fillStyle = rgb([PCA[(so + j) * 3], PCA[(so + j) * 3 + 1], PCA[(so + j) * 3 + 2]], 1);
          seg.fillRect(x, y, cell, cell);
        }
        if (state.masks && M[so + j] > 0) {
          c = P.mask_colors[(M[so + j] - 1) % P.mask_colors.length];
          seg.fillStyle = rgb(c, 0.55); seg.fillRect(x, y, cell, cell);
        }
      }
      cs.setAttribute("data-truth", String(truthOutline(seg)));
      outline(seg);
      var peak = argmax(row, 0, N);
      ca.setAttribute("data-query", String(state.query)); ca.setAttribute("data-peak", String(peak));
      var who = state.query < 0 ? (P.summary || "class token") : "patch (" + Math.floor(state.query / w) + ", " +
        state.query % w + ")";
      var most = state.noself && state.query >= 0 ? " attends most (after itself) to patch (" :
        " attends most to patch (";
      status.textContent = "layer " + P.layers[state.layer] + ", head " + (state.head + 1) + ": " + who + most +
        Math.floor(peak / w) + ", " + peak % w + ")";
    };
  }

  function textView() {
    status = el("div", { id: "xp-status" }, root);
    var box = el("div", { id: "xp-tokens" }, root), spans = [];
    function fill() {
      box.textContent = ""; spans = [];
      P.tokens[state.item].forEach(function (t, i) {
        var s = el("span", { class: "xp-tok", "data-i": String(i) }, box, t.replace(/\n/g, "\u21b5\n"));
        s.addEventListener("mouseenter", function () { state.query = i; draw(); });
        spans.push(s);
      });
      box.onmouseleave = function () { state.query = -1; draw(); };
      box.setAttribute("data-item", String(state.item));
    }
    return function () {
      if (String(state.item) !== box.getAttribute("data-item")) fill();
      var n = spans.length, q = state.query;
      var off = ((((state.item * nl + state.layer) * K + state.head) * n) + Math.max(q, 0)) * n;
      spans.forEach(function (s, j) {
        var v = A[off + j], c = cmap[v];
        var unseen = q >= 0 && P.causal && j > q;  // a causal model's later tokens: not attended, greyed out
        s.classList.toggle("xp-query", j === q);
        s.style.background = q < 0 || unseen ? "" : rgb(c, 1);
        s.style.color = unseen ? "#aaa" : q >= 0 && 0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2] < 128 ? "#fff" : "";
        s.setAttribute("data-attn", q < 0 ? "" : String(v));
      });
      if (q < 0) { status.textContent = "hover a token"; return; }
      var peak = argmax(A, off, n);
      status.textContent = "layer " + P.layers[state.layer] + ", head " + (state.head + 1) + ": token " + q +
        " attends most to token " + peak + " " + JSON.stringify(P.tokens[state.item][peak]);
    };
  }
  if (P.kind === "text") { draw(); section.setAttribute("data-ready", "1"); }
})();
