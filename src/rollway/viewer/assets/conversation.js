// The whole conversation, segment by segment. The last turn's segment is the last request's
// messages, each assistant message with the turn that sampled it, or marked "few-shot / not
// sampled" where no turn did. An earlier segment (before the agent rewrote its history) is
// rebuilt from its turns: its first prompt and the prompt ids between replies, decoded.
"use strict";

function contentText(content) {
  if (content === null || content === undefined) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((part) => part.text ?? JSON.stringify(part)).join("\n");
  return JSON.stringify(content, null, 2);
}

function toolCalls(message) {
  return (message.tool_calls || []).map((call) => {
    const fn = call.function || {};
    return el("div", { class: "tool-call" },
      el("span", { class: "tool-name", text: `${fn.name || "?"}(` }),
      el("code", { text: fn.arguments ?? "" }),
      el("span", { class: "tool-name", text: ")" }),
      call.id ? el("span", { class: "muted", text: `  ${call.id}` }) : null);
  });
}

function renderMessage(message, badges = [], extra = {}) {
  const who = message.role + (message.tool_call_id ? ` → ${message.tool_call_id}` : "") + (message.name ? ` (${message.name})` : "");
  const text = contentText(message.content);
  const body = el("div", { class: "message-body" }, text ? el("pre", { text }) : null, toolCalls(message));
  const role = [who, ...badges];
  const cls = `message role-${message.role}${extra.class ? ` ${extra.class}` : ""}`;
  if (message.role === "system" && text.length > 400) {
    return el("details", { ...extra, class: cls }, el("summary", { class: "role" }, ...role, ` (${text.length} characters)`), body);
  }
  return el("div", { ...extra, class: cls }, el("div", { class: "role" }, ...role), body);
}

function turnBadge(turn, turnSegment, segment) {
  const where = turnSegment !== segment ? ` (segment ${turnSegment})` : "";
  return el("span", { class: "badge turn-badge", text: `turn ${turn}${where}` });
}

function annotatedMessage(item, segment) {
  if (item.not_sampled) {
    const badge = el("span", { class: "badge not-sampled-badge", title: "an assistant message with no recorded turn behind it: the agent wrote it into the prompt, the model did not sample it", text: "few-shot / not sampled" });
    return renderMessage(item.message, [badge], { class: "not-sampled", "data-not-sampled": "1" });
  }
  const badges = item.turn === null ? [] : [turnBadge(item.turn, item.turn_segment, segment)];
  return renderMessage(item.message, badges, item.turn === null ? {} : { "data-sampled-turn": item.turn });
}

function renderedPart(part, hasIds) {
  const what = part.kind === "prompt"
    ? `the prompt this segment began with: ${num(part.tokens)} tokens as the chat template rendered them`
    : `between turns: ${num(part.tokens)} prompt tokens (template glue, tool results, user text)`;
  const body = part.text !== null ? el("pre", { text: part.text })
    : el("p", { class: "muted", text: hasIds ? "not decoded: no tokenizer loaded" : "no token ids recorded (a chat-level engine)" });
  // The glue between replies is short and holds the tool results: open; a prompt is long.
  const open = part.kind === "between" && (part.text || "").length < 2000;
  return el("details", { class: `rendered rendered-${part.kind}`, "data-part": part.kind, open }, el("summary", { text: what }), body);
}

function rebuiltPart(part, segment, hasIds) {
  if (part.kind !== "reply") return renderedPart(part, hasIds);
  return renderMessage(part.message, [turnBadge(part.turn, segment, segment)], { "data-sampled-turn": part.turn });
}

function segmentHeader(entry, first) {
  const turns = entry.turns.length ? `turns ${entry.turns[0]}–${entry.turns[entry.turns.length - 1]}` : "no turns";
  const how = entry.messages ? "the last request's messages" : "rebuilt from its turns";
  const text = first ? `segment ${entry.segment} · ${turns} · ${how}` : `segment ${entry.segment} starts: history rewritten, a fresh render of the conversation · ${turns} · ${how}`;
  return el("div", { class: first ? "segment-head" : "segment-head segment-divider", "data-segment-start": entry.segment, text });
}

function renderConversation(detail) {
  const segments = detail.conversation;
  const hasIds = !detail.trajectory || detail.trajectory.has_token_ids;
  const box = document.getElementById("conversation");
  if (!segments.length || (segments.length === 1 && !segments[0].messages.length)) {
    fill(box, el("p", { class: "muted", text: "no recorded conversation" }));
    return;
  }
  fill(box, segments.flatMap((entry, k) => [
    segments.length > 1 || entry.segment > 0 ? segmentHeader(entry, k === 0) : null,
    ...(entry.messages ? entry.messages.map((item) => annotatedMessage(item, entry.segment))
      : entry.parts.map((part) => rebuiltPart(part, entry.segment, hasIds))),
  ]));
}
