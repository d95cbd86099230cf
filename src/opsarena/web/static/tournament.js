// The tournament page: leaderboard and plots (SVG drawn here, no library, no network).
// Data comes from the embedded report (a shared HTML file) or the live API and its stream.
"use strict";

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (absent(value)) continue;
    if (key === "text") node.textContent = value;
    else node.setAttribute(key, String(value));
  }
  node.append(...nodes(children));
  return node;
}

function fixed(value, digits) {
  return value === null || value === undefined ? "-" : Number(value).toFixed(digits);
}

function renderSummary(view) {
  const t = view.tournament;
  document.getElementById("tournament-id").textContent = t.tournament_id;
  document.getElementById("tournament-name").textContent = t.name || "";
  const c = view.counts;
  const summary = document.getElementById("summary");
  fill(summary,
    el("span", { class: "big", id: "state" }, t.state),
    el("span", { id: "counted" }, say`${c.counted} of ${t.slots.length} matches counted`),
    el("span", {}, say`${c.void} void, ${c.playing} playing, ${c.pending} pending`),
    el("span", { class: "dim" },
      t.seed ? say`seed ${t.seed}` : say`seed commitment ${(t.seed_commitment || "-").slice(0, 16)}…`),
  );
  const running = document.getElementById("running");
  fill(running, ...view.running.map((m) => el("div", { class: "progress" },
    el("a", { href: `/matches/${m.match_id}` }, m.match_id), " ",
    el("progress", { max: Math.max(1, m.milestones), value: m.milestones_passed }),
    el("span", { class: "dim" }, say` ${m.state} ${duration(m.elapsed_ms)}`))));
}

function renderBoard(view) {
  const head = el("tr", {}, ["#", "competitor", "durable", "95% CI", "mu", "sigma", "ordinal",
    "BT [95%]", "points", "median to durable", "$ per durable"].map((h) => el("th", {}, h)));
  const rows = view.leaderboard.map((r, i) => el("tr", { "data-competitor": r.competitor },
    el("td", {}, i + 1), el("td", {}, r.competitor),
    el("td", {}, say`${r.durable}/${r.matches}`),
    el("td", {}, say`${fixed(r.durable_rate_ci[0], 2)}–${fixed(r.durable_rate_ci[1], 2)}`),
    el("td", {}, fixed(r.mu, 2)), el("td", {}, fixed(r.sigma, 2)),
    el("td", {}, fixed(r.ordinal, 2)),
    el("td", {}, say`${fixed(r.bt, 0)} [${fixed(r.bt_ci[0], 0)}, ${fixed(r.bt_ci[1], 0)}]`),
    el("td", {}, fixed(r.mean_points, 1)), el("td", {}, duration(r.median_ms_to_durable)),
    el("td", {}, fixed(r.cost_per_durable_usd, 4))));
  fill(document.getElementById("board"), el("thead", {}, head), el("tbody", {}, rows));
  const check = view.order_check;
  document.getElementById("order-check").textContent =
    say`${view.matches_counted} counted matches. Order check: ratings from ${check.shuffles} ` +
    say`shuffled match orders ${check.agree ? "agree" : "DISAGREE"} within their sigma ` +
    say`(worst gap ${fixed(check.worst_gap_sigma, 2)} sigma).`;
}

function renderChallenges(view) {
  const head = el("tr", {}, ["competitor", "challenge", "durable", "95% CI", "pass@k",
    "pass^k", "mean points", "median to durable"].map((h) => el("th", {}, h)));
  const ks = (table) => Object.entries(table).map(([k, v]) => say`${k}: ${fixed(v, 2)}`).join("  ");
  const rows = view.leaderboard.flatMap((r) => r.challenges.map((c) =>
    el("tr", { "data-competitor": r.competitor, "data-challenge": c.challenge },
      el("td", {}, r.competitor), el("td", {}, c.challenge),
      el("td", {}, say`${c.durable}/${c.matches}`),
      el("td", {}, say`${fixed(c.durable_rate_ci[0], 2)}–${fixed(c.durable_rate_ci[1], 2)}`),
      el("td", { class: "pass-at" }, ks(c.pass_at_k)),
      el("td", { class: "pass-hat" }, ks(c.pass_hat_k)),
      el("td", {}, fixed(c.mean_points, 1)), el("td", {}, duration(c.median_ms_to_durable)))));
  fill(document.getElementById("per-challenge"),
    el("thead", {}, head), el("tbody", {}, rows));
}

const W = 720, ROW = 26, LEFT = 150, RIGHT = 30, TOP = 10;

function axis(x0, x1, y, ticks, label) {
  const g = svg("g", { class: "axis" });
  g.append(svg("line", { x1: x0, x2: x1, y1: y, y2: y }));
  for (const [pos, text] of ticks) {
    g.append(svg("line", { x1: pos, x2: pos, y1: y, y2: y + 4 }));
    g.append(svg("text", { x: pos, y: y + 16, "text-anchor": "middle", text }));
  }
  g.append(svg("text", { x: (x0 + x1) / 2, y: y + 32, "text-anchor": "middle", text: label }));
  return g;
}

function plotRate(view) {
  const rows = view.leaderboard;
  const h = TOP + rows.length * ROW + 44;
  const x = (v) => LEFT + v * (W - LEFT - RIGHT);
  const root = svg("svg", { viewBox: `0 0 ${W} ${h}`, width: W, height: h, role: "img",
    "aria-label": "durable rate per competitor with 95% intervals" });
  rows.forEach((r, i) => {
    const y = TOP + i * ROW + ROW / 2;
    root.append(svg("text", { x: LEFT - 8, y: y + 4, "text-anchor": "end", text: r.competitor }));
    root.append(svg("line", { class: "whisker", x1: x(r.durable_rate_ci[0]),
      x2: x(r.durable_rate_ci[1]), y1: y, y2: y, "data-competitor": r.competitor }));
    for (const end of r.durable_rate_ci) {
      root.append(svg("line", { class: "whisker", x1: x(end), x2: x(end), y1: y - 6, y2: y + 6 }));
    }
    root.append(svg("circle", { class: "point", cx: x(r.durable_rate), cy: y, r: 5 },
      svg("title", { text: say`${r.competitor}: ${r.durable}/${r.matches} durable` })));
  });
  const ticks = [0, 0.25, 0.5, 0.75, 1].map((v) => [x(v), v.toFixed(2)]);
  root.append(axis(LEFT, W - RIGHT, TOP + rows.length * ROW + 4, ticks, "durable rate"));
  fill(document.getElementById("plot-rate"), root);
}

function plotCost(view) {
  const known = view.leaderboard.filter((r) => !absent(r.cost_per_durable_usd));
  const h = 260, bottom = h - 44;
  const target = document.getElementById("plot-cost");
  if (!known.length) {
    fill(target, el("p", { class: "dim" },
      "No competitor has a known cost per durable result yet (never durable, or cost unknown)."));
    return;
  }
  const most = Math.max(...known.map((r) => r.cost_per_durable_usd), 1e-6);
  const x = (v) => LEFT + v * (W - LEFT - RIGHT);
  const y = (c) => bottom - (c / most) * (bottom - TOP - 10);
  const root = svg("svg", { viewBox: `0 0 ${W} ${h}`, width: W, height: h, role: "img",
    "aria-label": "cost per durable result against durable rate" });
  root.append(svg("line", { class: "axis-line", x1: LEFT, x2: LEFT, y1: TOP, y2: bottom }));
  const top = Math.max(...known.map((r) => r.cost_per_durable_usd));
  root.append(svg("text", { x: LEFT - 8, y: y(most) + 4, "text-anchor": "end",
    text: top > 0 ? `$${most.toFixed(4)}` : "(all $0)" }));
  root.append(svg("text", { x: LEFT - 8, y: bottom, "text-anchor": "end", text: "$0" }));
  const labels = known.map((r) => {
    const cx = x(r.durable_rate), cy = y(r.cost_per_durable_usd);
    root.append(svg("circle", { class: "point", cx, cy, r: 5 },
      svg("title", { text: say`${r.competitor}: $${fixed(r.cost_per_durable_usd, 4)}` })));
    const label = svg("text", { class: "label", "data-competitor": r.competitor, text: r.competitor });
    root.append(label);
    return { node: label, cx, cy, right: cx <= W - 160 };
  });
  const ticks = [0, 0.25, 0.5, 0.75, 1].map((v) => [x(v), v.toFixed(2)]);
  root.append(axis(LEFT, W - RIGHT, bottom, ticks, "durable rate"));
  fill(target, root);
  placeLabels(root, labels, bottom - 2, h);
}

// Competitors whose points coincide (the same rate and cost: every scripted builder at $0)
// or nearly so would have their labels drawn over each other. Each label, the highest
// point's first, takes the nearest free line beside its point: right of it (left near the
// right edge), else one line up, one down, two up...; the plot grows upwards when a
// stack needs it. A label off its point gets a leader line to it. Measured in the page
// (getBBox), so it holds whatever the names and the font.
function placeLabels(root, labels, floor, h) {
  const GAP = 8;
  const taken = [];
  const clear = (box) => taken.every((o) => box.x + box.width <= o.x || o.x + o.width <= box.x ||
    box.y + box.height <= o.y || o.y + o.height <= box.y);
  let highest = 0;
  labels.sort((a, b) => a.cy - b.cy || a.cx - b.cx);
  for (const label of labels) {
    const node = label.node;
    node.setAttribute("x", label.right ? label.cx + GAP : label.cx - GAP);
    node.setAttribute("text-anchor", label.right ? "start" : "end");
    node.setAttribute("y", label.cy - 6);
    const home = node.getBBox();
    const line = home.height + 1;
    let box = null, dy = 0;
    for (let k = 0; box === null; k++) {
      dy = (k % 2 ? -1 : 1) * Math.ceil(k / 2) * line; // 0, up 1, down 1, up 2, down 2...
      if (dy > 0 && home.y + home.height + dy > floor) continue; // never over the axis
      const moved = { x: home.x, y: home.y + dy, width: home.width, height: home.height };
      if (clear(moved)) box = moved;
      if (k > 4 * labels.length + 8) { // nothing near: the next line above every label
        dy = Math.min(...taken.map((o) => o.y), home.y) - line - home.y;
        box = { ...moved, y: home.y + dy };
      }
    }
    taken.push(box);
    highest = Math.min(highest, box.y - 2);
    node.setAttribute("y", label.cy - 6 + dy);
    if (Math.abs(dy) >= line) {
      const edge = label.right ? box.x - 2 : box.x + box.width + 2;
      root.insertBefore(svg("line", { class: "leader", x1: label.cx, y1: label.cy, x2: edge,
        y2: box.y + box.height / 2 }), node);
    }
  }
  if (highest < 0) { // a stack rose above the plot: show it
    root.setAttribute("viewBox", `0 ${highest} ${W} ${h - highest}`);
    root.setAttribute("height", h - highest);
  }
}

function plotTime(view) {
  const rows = view.leaderboard;
  const all = rows.flatMap((r) => r.durable_ms);
  const target = document.getElementById("plot-time");
  if (!all.length) {
    fill(target, el("p", { class: "dim" }, "No durable result yet."));
    return;
  }
  const most = Math.max(...all) * 1.05;
  const h = TOP + rows.length * ROW + 44;
  const x = (ms) => LEFT + (ms / most) * (W - LEFT - RIGHT);
  const root = svg("svg", { viewBox: `0 0 ${W} ${h}`, width: W, height: h, role: "img",
    "aria-label": "time to durable per competitor" });
  rows.forEach((r, i) => {
    const y = TOP + i * ROW + ROW / 2;
    root.append(svg("text", { x: LEFT - 8, y: y + 4, "text-anchor": "end", text: r.competitor }));
    r.durable_ms.forEach((ms, j) => root.append(svg("circle", { class: "dot", cx: x(ms),
      cy: y + ((j % 5) - 2) * 2, r: 3.5 }, svg("title", { text: duration(ms) }))));
    if (r.median_ms_to_durable !== null) {
      const m = x(r.median_ms_to_durable);
      root.append(svg("line", { class: "median", x1: m, x2: m, y1: y - 9, y2: y + 9 }));
    }
  });
  const ticks = [0, 0.25, 0.5, 0.75, 1].map((f) => [x(f * most), duration(f * most)]);
  root.append(axis(LEFT, W - RIGHT, TOP + rows.length * ROW + 4, ticks,
    "time to durable (each dot a match; bar: median)"));
  fill(target, root);
}

function render(view) {
  renderSummary(view);
  renderBoard(view);
  renderChallenges(view);
  plotRate(view);
  plotCost(view);
  plotTime(view);
  document.body.dataset.rendered = String(view.tournament.last_sequence);
}

function start() {
  const live = document.getElementById("live");
  const embedded = document.getElementById("report-data");
  if (embedded) {
    liveStatus(live, false, "report");
    render(JSON.parse(embedded.textContent));
    return;
  }
  const id = decodeURIComponent(location.pathname.split("/").pop());
  document.getElementById("tournament-id").textContent = id; // before its record says it
  const problem = document.getElementById("problem");
  const stream = new EventSource(`/api/tournaments/${encodeURIComponent(id)}/stream`);
  stream.addEventListener("tournament", (message) => {
    liveStatus(live, true, "live");
    render(JSON.parse(message.data));
  });
  stream.addEventListener("end", () => {
    liveStatus(live, false, "finished");
    stream.close();
  });
  stream.onerror = () => {
    liveStatus(live, false, "reconnecting…");
    fetch(`/api/tournaments/${encodeURIComponent(id)}`).then((r) => {
      if (r.status === 404) {
        problem.hidden = false;
        problem.textContent = say`No tournament ${id} in this event log.`;
        liveStatus(live, false, "not found");
        stream.close();
      }
    });
  };
}

start();
