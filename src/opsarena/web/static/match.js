// One match, live: the record redraws the cards, each event extends the timeline and the
// transcripts. Everything comes from /api/matches/{id}/stream (server-sent events).
"use strict";

const MATCH_ID = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
const REPRODUCE = "; reproduce inside the host: "; // how the referee's failure_detail ends
const COLLAPSE_CHARS = 600;
const COLLAPSE_LINES = 8;
const TIMELINE_MAX = 2000;

const state = {
  record: null,
  lastSeq: 0,
  failures: {}, // territory -> the latest failed or referee_error attempt_result event
  transcripts: {}, // agent -> its <div> of entries
};

// -- cards ------------------------------------------------------------------------------

function chipState(milestone) {
  if (milestone.passed) return "passed";
  if (milestone.evaluating) return "evaluating";
  if (milestone.failure_category || milestone.failure_reason) return "failed";
  return "not-yet";
}

function money(agent) {
  const dollars = "$" + (agent.cost_microusd / 1e6).toFixed(4);
  return agent.cost_known === false ? dollars + " + unknown" : dollars;
}

function agentState(agent) {
  if (agent.running) return "running";
  return agent.terminal_state || "waiting";
}

function failureBlock(name, territory) {
  const seen = state.failures[name];
  // Resolved: the milestone that failed has passed since (or, from the record alone,
  // the territory is durable), so the failure is history, not what is wrong now.
  const resolved = seen ? seen.resolved : territory.durable_at_ms != null;
  let reason, where, detail;
  if (seen) {
    reason = seen.data.failure_reason || seen.data.failure_category || seen.data.verdict;
    where = say`${seen.data.milestone}, attempt ${seen.data.attempt}, at ${duration(seen.t_ms)}`;
    detail = seen.data.failure_detail;
  } else {
    const failing = Object.entries(territory.milestones).find(([, m]) => m.failure_detail);
    if (!failing && !territory.failure_reason) return null;
    reason = territory.failure_reason || (failing && failing[1].failure_category) || "failed";
    where = failing ? failing[0] : "";
    detail = failing ? failing[1].failure_detail : null;
  }
  const label = resolved ? "last failure, since passed: " : "current failure: ";
  const block = el("div", {
    class: resolved ? "failure resolved" : "failure", "data-territory": name,
    "data-resolved": String(resolved),
  }, el("div", {}, el("span", { class: "reason" }, label + reason), " ",
    el("span", { class: "dim" }, where)));
  if (detail) {
    const cut = detail.indexOf(REPRODUCE);
    const said = cut >= 0 ? detail.slice(0, cut) : detail;
    block.append(el("p", { class: "detail" }, said));
    if (cut >= 0) {
      block.append(el("div", { class: "dim" }, "reproduce inside the host:"),
        el("pre", {}, el("code", { class: "reproduce" }, detail.slice(cut + REPRODUCE.length))));
    }
  }
  return block;
}

function ledgerLine(l) {
  return say`${l.acknowledged} acknowledged, ${l.verified} verified, ${l.lost} lost, ` +
    say`${l.corrupted} corrupted, ${l.stale} stale, ${l.unexpected} unexpected, ` +
    (l.forgiven ? say`${l.forgiven} forgiven, ` : "") + say`${l.indeterminate} indeterminate`;
}

function card(name, territory, record) {
  const agent = record.agents[territory.agent] || {};
  const available = Object.values(territory.milestones)
    .reduce((sum, m) => sum + (m.points_available || 0), 0);
  const won = record.winner === name;
  const chips = Object.entries(territory.milestones).map(([id, m]) => el("span", {
    class: "chip", "data-milestone": id, "data-state": chipState(m),
    // Any challenge's milestones: the record names them and, when it has them, their titles.
    title: say`${id}${(record.milestone_titles || {})[id] ? " (" + record.milestone_titles[id] + ")" : ""}: ${chipState(m)}, ${m.attempts} attempts, ${m.points}/${m.points_available} points`,
  }, id));
  let durable = "not yet";
  if (territory.durable_at_ms !== null) durable = "durable at " + duration(territory.durable_at_ms);
  else if (record.match_state === "finished") durable = "never";
  const rows = [
    ["agent", say`${territory.agent} (${agent.kind || "?"})`],
    ["model", agent.model || "-"],
    ["agent state", agentState(agent) + (agent.terminal_detail ? ": " + agent.terminal_detail : "")],
    ["tokens", say`${agent.input_tokens || 0} in / ${agent.output_tokens || 0} out` +
      (agent.cached_tokens ? say` (${agent.cached_tokens} cached)` : "")],
    ["cost", agent.cost_microusd === undefined ? "-" : money(agent)],
    ["host", territory.state + (territory.host ? say` (${territory.host})` : "")],
    ["standing", territory.competitor_state],
    ["durable", durable],
  ];
  const ledger = territory.ledger;
  if (ledger) {
    rows.push(["ledger", ledgerLine(ledger)]);
  }
  if (territory.judging_stopped_reason) {
    rows.push(["judging stopped", say`${duration(territory.judging_stopped_at_ms)}: ` +
      (territory.judging_stopped_detail || territory.judging_stopped_reason)]);
  }
  if (territory.disk_frozen_at_ms !== null && territory.disk_frozen_at_ms !== undefined) {
    rows.push(["disk frozen", say`${duration(territory.disk_frozen_at_ms)}: ` +
      (territory.disk_frozen_detail || "over its disk quota")]);
  }
  if (territory.elimination_detail) {
    rows.push(["eliminated", say`${territory.elimination_source}: ${territory.elimination_detail}`]);
  }
  return el("article", { class: "card" + (won ? " won" : ""), "data-territory": name },
    el("h3", {}, el("span", {}, (won ? "★ " : "") + name),
      el("span", { class: "points", title: say`of ${available}` }, territory.milestone_points)),
    el("div", { class: "chips" }, chips),
    el("dl", {}, rows.map(([key, value]) => [el("dt", {}, key), el("dd", {}, value)])),
    failureBlock(name, territory));
}

function renderRecord(record) {
  state.record = record;
  document.title = say`opsarena — ${record.match_id}`;
  document.getElementById("challenge").textContent =
    say`${record.challenge} — ${record.challenge_title}`;
  const summary = document.getElementById("summary");
  fill(summary,
    el("span", { class: "big" }, el("span", { class: "state " + record.match_state, id: "match-state" },
      record.match_state)),
    el("span", {}, "elapsed ", el("b", {}, duration(record.elapsed_ms)),
      say` of ${duration(record.time_limit_s * 1000)}`),
    el("span", { id: "winner" }, "winner: ", record.winner
      ? el("span", { class: "winner" }, "★ " + record.winner)
      : (record.finish_reason ? "none" : "not yet")),
    el("span", { id: "finish-reason" }, "finish: ", el("b", {}, record.finish_reason || "not yet")),
    el("span", { class: "dim" }, say`${record.last_sequence} events, ` +
      say`${record.infrastructure_failures} infrastructure failures, `,
      // The seed stays secret while the match runs: only its commitment is public then.
      record.seed
        ? el("span", { id: "seed" }, say`seed ${record.seed}`)
        : el("span", { id: "seed", title: "SHA-256 commitment; the seed is revealed at the close" },
          say`seed commitment ${record.seed_commitment || "-"}`)),
    (record.log_quarantined || []).length
      ? el("span", { class: "fail", id: "tampered" },
        say`forged log rows set aside: ${record.log_quarantined.join("; ")}`)
      : null,
    (record.log_altered || []).length
      ? el("span", { class: "fail", id: "altered" },
        say`events altered behind the arena's back: seq ${record.log_altered.join(", ")}`)
      : null,
  );
  fill(document.getElementById("cards"),
    ...Object.entries(record.territories).map(([name, t]) => card(name, t, record)));
  for (const [name, agent] of Object.entries(record.agents)) {
    const title = transcriptOf(name).parentNode.querySelector("h3");
    title.textContent = say`${name} — ${agent.model} (${agent.territory})`;
  }
}

// -- timeline ---------------------------------------------------------------------------

function describe(event) {
  const d = event.data;
  switch (event.type) {
    case "match_created": return ["match", say`match created: ${d.challenge}, ${Object.keys(d.territories).length} territories`];
    case "host_provisioning": return ["", say`${d.territory}: provisioning a host`];
    case "host_provisioned": return ["", say`${d.territory}: host ${d.host} ready in ${d.provision_ms} ms`];
    case "host_failed": return ["fail", say`${d.territory}: host failed: ${d.error}`];
    case "preflight": return [d.ok ? "" : "fail", say`${d.territory}: preflight ${d.ok ? "ok" : "refused"}${d.detail ? ": " + d.detail : ""}`];
    case "match_started": return ["match", "match started: agents go"];
    case "agent_started": return ["", say`${d.agent} started`];
    case "attempt_result":
      if (d.verdict === "passed") return ["pass", say`${d.territory}: ${d.milestone} passed (+${d.points}, attempt ${d.attempt})`];
      return ["fail", say`${d.territory}: ${d.milestone} ${d.verdict}: ${d.failure_reason || d.failure_category || ""} (attempt ${d.attempt})`];
    case "fault_injected": return ["fault" + (d.ok ? "" : " fail"), say`${d.territory}: injected ${d.fault}${d.detail ? " — " + d.detail : ""}`];
    case "host_state": return [d.state === "rebooting" ? "fault" : (d.state === "lost" ? "fail" : ""), say`${d.territory}: host ${d.state}`];
    case "agent_ended": return [d.terminal_state === "completed" ? "" : "fail", say`${d.agent} ${d.terminal_state}${d.terminal_detail ? ": " + d.terminal_detail : ""}`];
    case "competitor_done": return ["", say`${d.territory} declared done${d.by ? " by " + d.by : ""}`];
    case "final_verification": return ["", say`${d.territory}: final verification, ${d.changed ? "changed" : "unchanged"}`];
    case "match_finished": return ["match", say`finished: ${d.finish_reason}, winner ${d.winner || "none"}`];
    case "match_closed": return ["match", "match closed: the record is final" + (d.seed ? say`, seed ${d.seed} revealed` : "")];
    case "log_tampered": return ["fail", d.kind === "altered"
      ? say`events altered behind the arena's back: seq ${(d.seqs || []).join(", ")}`
      : say`forged log rows set aside: ${d.rows} from seq ${d.first_seq}`];
    default: return null; // attempts in flight, usage, output: the cards and transcripts show them
  }
}

function addToTimeline(event) {
  const said = describe(event);
  if (!said) return;
  const list = document.getElementById("timeline");
  const follow = list.scrollTop + list.clientHeight >= list.scrollHeight - 4;
  list.append(el("li", { class: said[0], "data-seq": event.seq, "data-type": event.type },
    el("span", { class: "t" }, duration(event.t_ms)),
    el("span", { class: "kind" }, event.type.replaceAll("_", " ")),
    el("span", { class: "what" }, said[1])));
  while (list.children.length > TIMELINE_MAX) list.firstChild.remove();
  if (follow) list.scrollTop = list.scrollHeight;
}

// -- transcripts ------------------------------------------------------------------------

function transcriptOf(agent) {
  if (!state.transcripts[agent]) {
    const box = el("div", { class: "entries" });
    document.getElementById("transcripts").append(
      el("section", { class: "transcript", "data-agent": agent }, el("h3", {}, agent), box));
    state.transcripts[agent] = box;
  }
  return state.transcripts[agent];
}

function longText(label, text) {
  const value = typeof text === "string" ? text : JSON.stringify(text, null, 2);
  const lines = value.split("\n");
  if (value.length <= COLLAPSE_CHARS && lines.length <= COLLAPSE_LINES) {
    return el("div", {}, label ? el("span", { class: "dim" }, label + " ") : null, el("pre", {}, value));
  }
  const first = lines[0].slice(0, 100);
  return el("details", { class: "long" },
    el("summary", {}, say`${label ? label + ": " : ""}${first}… (${lines.length} lines, ${value.length} chars)`),
    el("pre", {}, value));
}

function transcriptEntry(event) {
  const d = event.data;
  if (event.type === "agent_output") {
    if (!d.text.trim()) return null;
    return el("div", { class: "entry" }, el("span", { class: "kind" }, d.stream),
      el("span", { class: "dim" }, duration(event.t_ms)), longText("", d.text));
  }
  const entry = d.entry || {};
  const kind = entry.kind || "entry";
  let head = "";
  if (kind === "tool_call") head = say`${entry.name}(${entry.arguments || ""})`;
  else if (kind === "exec") head = say`$ ${entry.command}` + (entry.exit_code !== undefined ? say` → exit ${entry.exit_code}` : "");
  else if (kind === "exec_request") head = say`$ ${entry.command}`;
  else if (kind === "put") head = say`put ${entry.path} (${entry.bytes} bytes)`;
  else if (kind === "put_request") head = say`put ${entry.path} (${entry.bytes} bytes, mode ${entry.mode})`;
  else if (kind === "retry") head = say`attempt ${entry.attempt}, retry in ${entry.delay_s}s`;
  else if (kind === "tool_result") head = entry.name || "";
  else if (kind === "assistant" || kind === "discarded") head = servedBy(entry);
  const node = el("div", { class: "entry", "data-kind": kind },
    el("span", { class: "kind" }, kind), el("span", { class: "dim" }, duration(event.t_ms)), " ",
    head ? el("code", {}, head) : null);
  const thought = reasoningText(entry);
  if (thought) node.append(reasoningBlock(thought));
  for (const key of ["content", "stdout", "stderr", "error"]) {
    if (entry[key]) node.append(longText(key === "content" ? "" : key, entry[key]));
  }
  return node;
}

// Which provider and model served a reply, and how it finished (the llm agent records it).
function servedBy(entry) {
  const parts = [entry.provider, entry.served_model].filter(Boolean);
  if (entry.why) parts.push(say`not sent back: ${entry.why}`);
  else if (entry.finish_reason && entry.finish_reason !== "stop" && entry.finish_reason !== "tool_calls") {
    parts.push(say`finish ${entry.finish_reason}`);
  }
  return parts.join(" · ");
}

// A reply's reasoning: `reasoning` / `reasoning_content` text, else the readable parts of
// `reasoning_details` (encrypted parts are only counted).
function reasoningText(entry) {
  const text = entry.reasoning || entry.reasoning_content;
  if (typeof text === "string" && text.trim()) return text;
  if (!Array.isArray(entry.reasoning_details)) return "";
  const readable = entry.reasoning_details
    .map((d) => (d && (d.text || d.summary)) || "").filter(Boolean).join("\n");
  const hidden = entry.reasoning_details.filter((d) => d && d.type === "reasoning.encrypted").length;
  return readable || (hidden ? say`(${hidden} encrypted reasoning block${hidden > 1 ? "s" : ""})` : "");
}

// Reasoning is shown collapsed: a summary line, the text on a click.
function reasoningBlock(text) {
  const first = text.split("\n")[0].slice(0, 80);
  return el("details", { class: "reasoning" },
    el("summary", { class: "dim" }, say`reasoning: ${first}${text.length > 80 ? "…" : ""} (${text.length} chars)`),
    el("pre", {}, text));
}

function addToTranscript(event) {
  if (event.type !== "agent_output" && event.type !== "agent_transcript") return;
  const entry = transcriptEntry(event);
  if (entry) transcriptOf(event.data.agent).append(entry);
}

// -- the stream -------------------------------------------------------------------------

function onEvent(event) {
  if (event.seq <= state.lastSeq) return; // a reconnect resends nothing we have, but be sure
  state.lastSeq = event.seq;
  if (event.type === "match_created") {
    for (const spec of Object.values(event.data.territories)) transcriptOf(spec.agent);
  }
  if (event.type === "attempt_result") {
    const failed = state.failures[event.data.territory];
    if (event.data.verdict !== "passed") {
      state.failures[event.data.territory] = { ...event, resolved: false };
    } else if (failed && failed.data.milestone === event.data.milestone) {
      failed.resolved = true; // the milestone it failed has passed since
    }
  }
  addToTimeline(event);
  addToTranscript(event);
}

async function explainClosed() {
  const live = document.getElementById("live");
  const problem = document.getElementById("problem");
  try {
    const answer = await fetch("/api/matches/" + encodeURIComponent(MATCH_ID));
    if (answer.ok) { connect(); return; }
    problem.textContent = (await answer.json()).detail || answer.statusText;
  } catch (error) {
    problem.textContent = "the scoreboard server cannot be reached";
  }
  problem.hidden = false;
  liveStatus(live, false, "retrying…");
  setTimeout(connect, 2000);
}

function connect() {
  const live = document.getElementById("live");
  const url = `/api/matches/${encodeURIComponent(MATCH_ID)}/stream?after=${state.lastSeq}`;
  const source = new EventSource(url);
  source.addEventListener("open", () => {
    document.getElementById("problem").hidden = true;
    liveStatus(live, true, "live");
  });
  source.addEventListener("event", (message) => onEvent(JSON.parse(message.data)));
  source.addEventListener("record", (message) => renderRecord(JSON.parse(message.data)));
  source.addEventListener("end", () => {
    source.close();
    liveStatus(live, false, "match closed: final record");
  });
  source.addEventListener("broken", (message) => {
    source.close();
    const problem = document.getElementById("problem");
    problem.textContent = JSON.parse(message.data).detail;
    problem.hidden = false;
    liveStatus(live, false, "log cannot be read");
  });
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) explainClosed();
    else liveStatus(live, false, "reconnecting…");
  };
}

document.getElementById("match-id").textContent = MATCH_ID;
connect();
