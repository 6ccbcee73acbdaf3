// The listing page: rollouts and groups, each paged, filtered and sorted by the server.
"use strict";

const state = {
  status: "", group: "", q: "", version: "", limit: 50, offset: 0, sort: "task_index", order: "asc",
  gOffset: 0, gSort: "first_task", gOrder: "asc",
};

function readLocation() {
  const params = new URLSearchParams(location.search);
  for (const key of Object.keys(state)) {
    if (params.has(key)) state[key] = typeof state[key] === "number" ? Number(params.get(key)) : params.get(key);
  }
}

function writeLocation() {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(state)) if (value !== "" && value !== 0) params.set(key, value);
  history.replaceState(null, "", `?${params}`);
}

async function loadRun() {
  const run = await getJSON("/api/run");
  document.getElementById("run-name").textContent = run.name;
  document.title = `rollway view: ${run.name}`;
  const t = run.totals;
  const totals = document.getElementById("totals");
  fill(totals, 
    fact("rollouts", num(t.rollouts)),
    ...Object.entries(t.by_status).map(([status, n]) => el("span", { class: "fact" }, statusChip(status), ` ${num(n)}`)),
    // Completion and reward apart: an RL run completes every rollout long before it learns.
    fact("completed", percent(t.completed_rate)),
    t.truncated_rate ? fact("truncated (a gateway limit)", percent(t.truncated_rate)) : null,
    fact("mean reward", num(t.mean_reward)),
    fact("groups", num(t.groups)),
    fact("flat groups (no reward spread)", num(t.flat_groups)),
    fact("turns", num(t.turns)),
    fact("sampled tokens", num(t.sampled_tokens)),
    fact("mean duration", seconds(t.mean_elapsed_s)),
    run.config.agent_name ? fact("agent", run.config.agent_name) : null,
    run.config.model ? fact("model", run.config.model) : null,
    t.unreadable ? fact("unreadable records", num(t.unreadable)) : null,
  );
  renderUnreadable(run.unreadable, t.unreadable);
  const select = document.getElementById("status");
  for (const status of Object.keys(t.by_status)) select.append(el("option", { value: status, text: status }));
  select.value = state.status;
  renderVersions(run.versions);
}

function renderUnreadable(rows, total) {
  // Records that did not read: listed apart with the reason, never in a statistic.
  document.getElementById("unreadable-section").hidden = rows.length === 0;
  document.getElementById("unreadable-count").textContent = rows.length < total ? `(the first ${num(rows.length)} of ${num(total)})` : "";
  document.querySelector("#unreadable tbody").replaceChildren(...rows.map((row) => el("tr", { "data-unreadable": row.key },
    el("td", {}, el("a", { href: `/rollouts/${encodeURIComponent(row.key)}`, text: row.key })),
    el("td", { class: "reason", text: row.reason }))));
}

async function loadRollouts() {
  const params = new URLSearchParams({
    offset: state.offset, limit: state.limit, sort: state.sort, order: state.order,
    status: state.status, group: state.group, q: state.q,
  });
  if (state.version !== "") params.set("policy_version", state.version);
  const page = await getJSON(`/api/rollouts?${params}`);
  componentHeaders("rollouts", 'th[data-sort="reward"]', page.reward_components, sortBy);
  const body = document.querySelector("#rollouts tbody");
  body.replaceChildren(...page.rows.map((row) => el("tr", { "data-key": row.key },
    el("td", {}, el("a", { href: `/rollouts/${encodeURIComponent(row.key)}`, text: row.key })),
    el("td", {}, statusChip(row.status)),
    el("td", { class: "num", text: num(row.reward) }),
    ...componentCells(page.reward_components, row.reward_components),
    el("td", { class: "num", "data-advantage": row.advantage ?? "", text: num(row.advantage, 2) }),
    el("td", {}, el("a", { href: "#", class: "group-link", text: row.group_id, onclick: (e) => { e.preventDefault(); filterGroup(row.group_id); } })),
    el("td", { class: "num", "data-version": row.policy_version ?? "" },
      row.policy_version === null || row.policy_version === undefined ? "–"
        : el("a", { href: "#", text: row.policy_version, title: "only this version", onclick: (e) => { e.preventDefault(); filterVersion(row.policy_version); } })),
    el("td", { class: "num", text: num(row.turns) }),
    el("td", { class: "num", text: num(row.sampled_tokens) }),
    el("td", { class: "num", text: seconds(row.elapsed_s) }),
    el("td", { class: "reason", title: row.reason || "", text: row.error_kind ? `${row.error_kind}: ${row.reason || ""}` : "" }),
  )));
  pager("rollouts-pager", page.matched, page.total, state.offset, state.limit, (offset) => { state.offset = offset; refresh(); });
  markSorted("rollouts", state.sort, state.order);
}

async function loadGroups() {
  const params = new URLSearchParams({ offset: state.gOffset, limit: state.limit, sort: state.gSort, order: state.gOrder });
  const page = await getJSON(`/api/groups?${params}`);
  componentHeaders("groups", 'th[data-sort="mean_reward"]', page.reward_components, sortGroupsBy, "the group's mean");
  const body = document.querySelector("#groups tbody");
  body.replaceChildren(...page.rows.map((g) => el("tr", { "data-group": g.group_id },
    el("td", {}, el("a", { href: "#", text: g.group_id, onclick: (e) => { e.preventDefault(); filterGroup(g.group_id); } })),
    el("td", { class: "num", text: num(g.n) }),
    el("td", { class: "num", text: num(g.scored) }),
    el("td", { class: "num", text: num(g.mean_reward) }),
    ...componentCells(page.reward_components, g.reward_components),
    el("td", { class: "num", text: num(g.std_reward) }),
    el("td", { class: "num", text: percent(g.success_rate) }),
    el("td", g.flat ? { class: "flat", "data-flat": "1", title: "fewer than two different rewards: no GRPO signal", text: "flat" } : {}),
  )));
  pager("groups-pager", page.matched, page.total, state.gOffset, state.limit, (offset) => { state.gOffset = offset; loadGroups(); });
  markSorted("groups", state.gSort, state.gOrder);
}

function pager(id, matched, total, offset, limit, go) {
  const first = matched ? offset + 1 : 0;
  const last = Math.min(offset + limit, matched);
  const filtered = matched === total ? "" : ` (${num(total)} in all)`;
  document.getElementById(id).replaceChildren(
    el("button", { type: "button", disabled: offset === 0, text: "‹ previous", onclick: () => go(Math.max(0, offset - limit)) }),
    el("span", { text: ` ${num(first)}–${num(last)} of ${num(matched)}${filtered} ` }),
    el("button", { type: "button", disabled: offset + limit >= matched, text: "next ›", onclick: () => go(offset + limit) }),
  );
}

function sortGroupsBy(column) {
  state.gOrder = state.gSort === column && state.gOrder === "asc" ? "desc" : "asc";
  state.gSort = column;
  state.gOffset = 0;
  writeLocation();
  loadGroups().catch(showError);
}

function sortBy(column) {
  state.order = state.sort === column && state.order === "asc" ? "desc" : "asc";
  state.sort = column;
  state.offset = 0;
  refresh();
}

function filterGroup(group) {
  state.group = group;
  document.getElementById("group").value = group;
  state.offset = 0;
  refresh();
}

function filterVersion(version) {
  state.version = String(version);
  document.getElementById("version").value = state.version;
  state.offset = 0;
  refresh();
}

function refresh() {
  writeLocation();
  return loadRollouts().catch(showError);
}

function showError(error) {
  document.querySelector("#rollouts tbody").replaceChildren(el("tr", {}, el("td", { colspan: 10, class: "problem", text: String(error.message || error) })));
}

function wire() {
  const form = document.getElementById("filters");
  for (const name of ["group", "q", "version"]) document.getElementById(name).value = state[name];
  document.getElementById("limit").value = String(state.limit);
  let timer = null;
  form.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      state.status = form.status.value;
      state.group = form.group.value.trim();
      state.q = form.q.value.trim();
      state.version = form.version.value.trim();
      state.limit = Number(form.limit.value);
      state.offset = 0;
      refresh();
    }, 200);
  });
  form.addEventListener("submit", (e) => e.preventDefault());
  document.getElementById("clear").addEventListener("click", () => {
    form.reset();
    Object.assign(state, { status: "", group: "", q: "", version: "", offset: 0 });
    refresh();
  });
  for (const th of document.querySelectorAll("#rollouts th[data-sort]")) {
    th.addEventListener("click", () => sortBy(th.dataset.sort));
  }
  for (const th of document.querySelectorAll("#groups th[data-sort]")) {
    th.addEventListener("click", () => sortGroupsBy(th.dataset.sort));
  }
}

readLocation();
wire();
loadRun().catch(showError);
refresh();
loadGroups().catch(showError);
