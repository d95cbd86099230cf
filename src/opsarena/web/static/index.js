// The matches list, kept current by the /api/stream server-sent events.
"use strict";

function renderRows(rows) {
  const body = document.getElementById("rows");
  fill(body, ...rows.map((row) => el("tr", { "data-match": row.match_id },
    el("td", {}, el("a", { href: "/matches/" + encodeURIComponent(row.match_id) }, row.match_id)),
    el("td", { title: row.challenge_title || "" }, row.challenge || "?"),
    el("td", {}, row.error
      ? el("span", { class: "error", title: row.error }, "invalid log")
      : el("span", { class: "state " + row.state }, row.state)),
    el("td", { class: row.winner ? "winner" : "dim" }, row.winner || "-"),
    el("td", {}, row.finish_reason || "-"),
    el("td", {}, duration(row.duration_ms)),
    el("td", {}, wallTime(row.started_at || row.created)),
  )));
  document.getElementById("empty").hidden = rows.length > 0;
}

function connect() {
  const live = document.getElementById("live");
  const source = new EventSource("/api/stream");
  source.addEventListener("matches", (message) => {
    liveStatus(live, true, "live");
    renderRows(JSON.parse(message.data));
  });
  source.onerror = () => liveStatus(live, false, "reconnecting…");
}

connect();
