// One rollout: the conversation the agent saw, its turns, and per sample the exact token stream
// a trainer reads (prompt, then response ids under the loss mask), with logprobs as a heat shade.
"use strict";

const key = decodeURIComponent(location.pathname.split("/").pop());
let pageTokens = 4096;
let samples = [];

function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((part) => part.text ?? JSON.stringify(part)).join("\n");
  return JSON.stringify(content, null, 2);
}

function renderMessage(message) {
  const calls = (message.tool_calls || []).map((call) => {
    const fn = call.function || {};
    return el("div", { class: "tool-call" },
      el("span", { class: "tool-name", text: `${fn.name || "?"}(` }),
      el("code", { text: fn.arguments ?? "" }),
      el("span", { class: "tool-name", text: ")" }),
      call.id ? el("span", { class: "muted", text: `  ${call.id}` }) : null);
  });
  const who = message.role + (message.tool_call_id ? ` → ${message.tool_call_id}` : "") + (message.name ? ` (${message.name})` : "");
  const text = contentText(message.content);
  const body = el("div", { class: "message-body" }, text ? el("pre", { text }) : null, calls);
  if (message.role === "system" && text.length > 400) {
    return el("details", { class: `message role-${message.role}` }, el("summary", { class: "role", text: `${who} (${text.length} characters)` }), body);
  }
  return el("div", { class: `message role-${message.role}` }, el("div", { class: "role", text: who }), body);
}

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
    t && t.is_truncated ? fact("truncated", t.truncation_reason || "yes") : null,
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

function shown(text) {
  // Whitespace a reader would miss: a newline shows as ↵ then breaks, a tab as →.
  return text.replace(/\n/g, "↵\n").replace(/\t/g, "→\t");
}

function heat(logprob) {
  const p = Math.exp(logprob);
  return `hsl(${Math.round(120 * p)} 70% 82%)`;
}

function renderSample(sample, texts) {
  // One page of the sample's stream: positions are the whole stream's (sample.offset on).
  const marks = new Map();
  const add = (at, node) => { if (!marks.has(at)) marks.set(at, []); marks.get(at).push(node); };
  add(sample.prompt_len, el("span", { class: "mark boundary", text: "response ▸" }));
  for (const turn of sample.turns) {
    add(turn.start, el("span", { class: "mark turn", "data-turn": turn.index, text: `turn ${turn.index}${turn.reissued ? " (reissued)" : ""}` }));
  }
  if (sample.drift_at !== null) add(sample.drift_at, el("span", { class: "mark drift-mark", text: "drift ▸" }));
  const prompt = document.createDocumentFragment();
  const response = document.createDocumentFragment();
  sample.ids.forEach((id, k) => {
    const i = sample.offset + k;
    const target = i < sample.prompt_len ? prompt : response;
    for (const mark of marks.get(i) || []) target.append(mark);
    const text = texts[id];
    const node = document.createElement("span");
    node.className = "tok";
    node.textContent = text === undefined ? `${id} ` : shown(text);
    const tip = [`#${i}`, `id ${id}`];
    if (text !== undefined) tip.push(JSON.stringify(text));
    if (i < sample.prompt_len) {
      node.classList.add("prompt");
      tip.push("prompt");
    } else {
      const j = i - sample.prompt_len - sample.response_offset;
      const mask = sample.loss_mask[j];
      node.dataset.mask = String(mask);
      tip.push(`mask ${mask}`);
      if (mask === 1) {
        node.style.background = heat(sample.logprobs[j]);
        tip.push(`logprob ${sample.logprobs[j].toFixed(4)} (p ${Math.exp(sample.logprobs[j]).toFixed(3)})`);
      }
      if (sample.policy_versions && sample.policy_versions[j] >= 0) tip.push(`policy version ${sample.policy_versions[j]}`);
    }
    if (i === sample.drift_at) node.classList.add("drift");
    node.title = tip.join(" · ");
    target.append(node);
  });
  const responseLen = sample.length - sample.prompt_len;
  const header = `segment ${sample.segment}: prompt ${num(sample.prompt_len)} tokens, response ${num(responseLen)} (${num(sample.sampled)} sampled, mask 1; ${num(responseLen - sample.sampled)} mask 0)`;
  const blocks = [el("h3", { text: header }), pager(sample)];
  if (sample.offset < sample.prompt_len) {
    const shownPrompt = Math.min(sample.prompt_len, sample.offset + sample.ids.length) - sample.offset;
    blocks.push(el("details", { class: "prompt-block" }, el("summary", { text: `prompt (${num(sample.prompt_len)} tokens${shownPrompt < sample.prompt_len ? `, ${num(shownPrompt)} on this page` : ""})` }), el("div", { class: "stream" }, prompt)));
  }
  blocks.push(el("div", { class: "stream" }, response));
  return el("div", { class: "sample", "data-segment": sample.segment, "data-offset": sample.offset }, ...blocks);
}

function pager(sample) {
  // A long sample comes a page at a time: the page lays out only the tokens it shows.
  if (sample.length <= pageTokens && sample.offset === 0) return null;
  const last = sample.offset + sample.ids.length;
  const go = (offset) => el("button", { type: "button", text: offset < sample.offset ? "◀ earlier" : "later ▶", onclick: () => showPage(sample.segment, offset) });
  return el("div", { class: "pager" },
    sample.offset > 0 ? go(Math.max(0, sample.offset - pageTokens)) : null,
    el("span", { class: "muted", text: ` tokens ${num(sample.offset)}–${num(last)} of ${num(sample.length)} ` }),
    last < sample.length ? go(last) : null);
}

async function showPage(segment, offset) {
  const page = await getJSON(`/api/rollouts/${encodeURIComponent(key)}/tokens?segment=${segment}&offset=${offset}`);
  const shown = document.querySelector(`.sample[data-segment="${segment}"]`);
  const fresh = renderSample(page, page.texts);
  shown.replaceWith(fresh);
  fresh.scrollIntoView();
}

function showTurn(turn) {
  // The page of the sample that holds the turn's first completion token.
  const sample = samples.find((s) => s.segment === turn.segment);
  const span = sample && sample.turns.find((t) => t.index === turn.index);
  if (span) showPage(turn.segment, Math.floor(span.start / pageTokens) * pageTokens);
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
  renderFacts(detail);
  const t = detail.trajectory;
  const messages = t ? t.messages : [];
  document.getElementById("conversation").replaceChildren(
    ...(messages.length ? messages.map(renderMessage) : [el("p", { class: "muted", text: "no recorded conversation" })]));
  pageTokens = detail.page_tokens;
  samples = detail.samples;
  renderTurns(detail.turns);
  document.getElementById("tokenizer").textContent = detail.tokenizer ? `tokens decoded with ${detail.tokenizer}` : "no tokenizer loaded: token ids shown";
  document.getElementById("samples").replaceChildren(
    ...(detail.samples.length ? detail.samples.map((s) => renderSample(s, detail.texts)) : [el("p", { class: "muted", text: t && !t.has_token_ids ? "this engine gave no token ids" : "no samples" })]));
  renderDebug(detail.debug, detail.record.started_at);
  document.getElementById("task").textContent = JSON.stringify(detail.record.task, null, 2);
  document.getElementById("record").textContent = JSON.stringify(detail.record, null, 2);
  document.getElementById("tools").textContent = JSON.stringify(t ? t.tools : null, null, 2);
  document.body.dataset.ready = "1";
  // The page filled in after load: go to the part the address names (#samples, #turns...).
  if (location.hash) document.getElementById(location.hash.slice(1))?.scrollIntoView();
}

main();
