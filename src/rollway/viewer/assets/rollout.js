// One rollout: its group with advantages, its whole conversation (conversation.js), its turns,
// and per sample the exact token stream a trainer reads (tokens.js).
"use strict";

const key = decodeURIComponent(location.pathname.split("/").pop());

function renderFacts(detail) {
  const r = detail.record;
  const t = detail.trajectory;
  document.getElementById("rollout-key").textContent = r.rollout_key;
  document.title = `rollway view: ${r.rollout_key}`;
  fill(document.getElementById("facts"), 
    el("span", { class: "fact" }, statusChip(r.status)),
    fact("reward", num(r.reward)),
    fact("group", el("a", { href: `/?group=${encodeURIComponent(r.group_id)}`, text: r.group_id })),
    fact("sample", r.sample_index),
    fact("attempts", r.attempts),
    fact("duration", seconds(r.elapsed_s)),
    fact("rollout id", r.rollout_id),
    r.policy_version !== null ? fact("policy version", r.policy_version) : null,
    t ? fact("model", t.model) : null,
    t ? fact("segments", t.segment_count) : null,
    r.finish_reason ? fact("finish", r.finish_reason) : null,
    t && t.is_truncated ? fact("truncated", t.truncation_reason) : null,
    t && t.is_cancelled ? fact("cancelled", "yes") : null,
  );
  const problems = [];
  if (r.error_kind) problems.push(`${r.error_kind} error: ${r.reason || ""}`);
  else if (r.reason) problems.push(r.reason);
  for (const e of r.cleanup_errors || []) problems.push(`cleanup: ${e}`);
  for (const e of (t && t.engine_errors) || []) problems.push(`engine: ${e}`);
  if (t && t.drift && t.drift.first_mismatch !== null) {
    problems.push(`drift: recorded ${t.drift.recorded_tokens} tokens, a fresh render ${t.drift.rerendered_tokens}; first mismatch at ${t.drift.first_mismatch}, ${t.drift.differing_tokens} differing`);
  }
  const box = document.getElementById("problem");
  box.hidden = problems.length === 0;
  box.replaceChildren(...problems.map((p) => el("div", { text: p })));
}

function renderGroup(group, current) {
  // The rollout among its siblings: GRPO's advantage is relative to them.
  if (!group) return;
  document.getElementById("group-section").hidden = false;
  fill(document.getElementById("group-facts"),
    fact("group", el("a", { href: `/?group=${encodeURIComponent(group.group_id)}`, text: group.group_id })),
    fact("rollouts", num(group.n)),
    fact("scored", num(group.scored)),
    fact("mean reward", num(group.mean_reward)),
    fact("std", num(group.std_reward)),
    fact("ran to the end (completed or truncated)", percent(group.success_rate)),
    group.flat ? el("span", { class: "fact flat", "data-flat": "1", title: "fewer than two different rewards: every advantage is 0, no GRPO signal", text: "flat group: no signal" }) : null);
  groupView = { group, current, sort: "sample_index", order: "asc" };
  componentHeaders("group", 'th[data-sort="reward"]', group.reward_components || [], sortGroup);
  for (const th of document.querySelectorAll("#group th[data-sort]:not([data-component])")) {
    th.addEventListener("click", () => sortGroup(th.dataset.sort));
  }
  renderGroupRows();
}

// The group's rollouts, sorted here (the page has them all): by a column or a reward
// component (reward/<name>), rows without a value last.
let groupView = null;

function sortGroup(column) {
  groupView.order = groupView.sort === column && groupView.order === "asc" ? "desc" : "asc";
  groupView.sort = column;
  renderGroupRows();
}

function renderGroupRows() {
  const { group, current, sort, order } = groupView;
  const names = group.reward_components || [];
  const value = (row) => (sort.startsWith("reward/") ? (row.reward_components || {})[sort.slice(7)] : row[sort]);
  const known = group.rollouts.filter((row) => typeof value(row) === "number");
  known.sort((a, b) => (order === "asc" ? value(a) - value(b) : value(b) - value(a)));
  const rows = [...known, ...group.rollouts.filter((row) => typeof value(row) !== "number")];
  document.querySelector("#group tbody").replaceChildren(...rows.map((row) => el("tr", {
    "data-sibling": row.key, class: row.key === current ? "current" : null, "data-current": row.key === current ? "1" : null },
  el("td", {}, row.key === current ? el("b", { text: `${row.key} (this one)` }) : el("a", { href: `/rollouts/${encodeURIComponent(row.key)}`, text: row.key })),
  el("td", { class: "num", text: row.sample_index }),
  el("td", {}, statusChip(row.status)),
  el("td", { class: "num", text: num(row.reward) }),
  ...componentCells(names, row.reward_components),
  el("td", { class: "num", "data-advantage": row.advantage ?? "", text: num(row.advantage, 3) }),
  el("td", { class: "num", text: num(row.turns) }),
  el("td", { class: "num", text: num(row.sampled_tokens) }))));
  markSorted("group", sort, order);
}

function renderTurns(turns) {
  document.querySelector("#turns tbody").replaceChildren(...turns.map((turn) => el("tr", { "data-turn-row": turn.index, onclick: () => showTurn(turn), title: "show its tokens" },
    el("td", { class: "num", text: turn.index }),
    el("td", { class: "num", text: turn.segment }),
    el("td", { text: turn.finish_reason }),
    el("td", { class: "num", text: num(turn.prompt_tokens) }),
    el("td", { class: "num", text: num(turn.completion_tokens) }),
    el("td", { class: "num", text: `${num(turn.latency_ms, 1)} ms` }),
    el("td", { text: turn.policy_versions.join(", ") }),
    el("td", { text: [turn.reissued ? `reissued ${turn.reissued}×` : "", turn.tool_call_parse_error ? `tool call did not parse: ${turn.tool_call_parse_error}` : "", turn.logprob_kind !== "raw_logprobs" ? turn.logprob_kind : ""].filter(Boolean).join("; ") }),
  )));
}

function renderDebug(events, startedAt) {
  if (!events.length) return;
  document.getElementById("debug-section").hidden = false;
  document.querySelector("#debug tbody").replaceChildren(...events.map((event) => {
    const { t, attempt, kind, rollout_id: _, ...rest } = event;
    return el("tr", {},
      el("td", { class: "num", text: typeof t === "number" ? (t - startedAt).toFixed(3) : "" }),
      el("td", { class: "num", text: attempt }),
      el("td", { text: kind }),
      el("td", {}, el("code", { text: JSON.stringify(rest) })));
  }));
}

async function main() {
  let detail;
  try {
    detail = await getJSON(`/api/rollouts/${encodeURIComponent(key)}`);
  } catch (error) {
    const box = document.getElementById("problem");
    box.hidden = false;
    box.textContent = String(error.message || error);
    return;
  }
  if (detail.unreadable) {
    // A record that does not read: its key and why, nothing of its content.
    document.getElementById("rollout-key").textContent = detail.unreadable.key;
    const box = document.getElementById("problem");
    box.hidden = false;
    box.dataset.unreadable = "1";
    box.textContent = `unreadable record: ${detail.unreadable.reason}`;
    document.body.dataset.ready = "1";
    return;
  }
  renderFacts(detail);
  const t = detail.trajectory;
  renderGroup(detail.group, detail.record.rollout_key);
  renderConversation(detail);
  renderTurns(detail.turns);
  renderTokens(detail);
  renderDebug(detail.debug, detail.record.started_at);
  document.getElementById("task").textContent = JSON.stringify(detail.record.task, null, 2);
  document.getElementById("record").textContent = JSON.stringify(detail.record, null, 2);
  document.getElementById("tools").textContent = JSON.stringify(t ? t.tools : null, null, 2);
  document.body.dataset.ready = "1";
  // The page filled in after load: go to the part the address names (#samples, #turns...).
  if (location.hash) document.getElementById(location.hash.slice(1))?.scrollIntoView();
}

main();
