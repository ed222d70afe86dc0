// artsdk view: one page, state in the address (#/view?key=value...), data from /api.
"use strict";

const main = document.getElementById("main");
const crumbs = document.getElementById("crumbs");
let refresh = null; // the model page polls while a run is going

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) e.setAttribute(k, v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c instanceof Node ? c : String(c));
  return e;
}
const svg = (tag, attrs = {}, ...children) => {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  for (const c of children.flat()) if (c) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
};
const fmt = (x, d = 3) => (x === null || x === undefined || Number.isNaN(x)) ? "–" : Number(x).toFixed(d);
const link = (view, params, text) => el("a", { href: "#/" + view + "?" + new URLSearchParams(params) }, text);
// the run a page shows travels in its links: two runs of one model never mix on a page
const inRun = p => (p.run !== undefined && p.run !== null ? { run: p.run } : {});

async function api(path, params = {}) {
  const q = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== "" && v !== null && v !== undefined));
  const r = await fetch("/api/" + path + (q.toString() ? "?" + q : ""));
  if (!r.ok) throw new Error((await r.json()).detail || r.statusText);
  return r.json();
}

function route() {
  clearInterval(refresh);
  const [view, query] = (location.hash.replace(/^#\/?/, "") || "").split("?");
  const params = Object.fromEntries(new URLSearchParams(query || ""));
  const pages = { "": projects, model: model, step: step, trajectory: trajectory, trajectories: trajectories,
                  compare: compare };
  crumbs.replaceChildren();
  (pages[view] || projects)(params).catch(e => main.replaceChildren(el("p", { class: "error" }, "error: " + e.message)));
}
window.addEventListener("hashchange", route);
route();

function setCrumbs(p) {
  const parts = [];
  if (p.project !== undefined) parts.push(el("span", {}, p.project || "(no project)"));
  if (p.model) parts.push(link("model", { project: p.project, model: p.model, ...inRun(p) }, p.model));
  if (p.run) parts.push(el("span", { class: "muted" }, "run " + p.run));
  if (p.step !== undefined) parts.push(link("step", { project: p.project, model: p.model, step: p.step, ...inRun(p) }, "step " + p.step));
  crumbs.replaceChildren(...parts.flatMap((x, i) => i ? [" / ", x] : [x]));
}

// -- projects and models ------------------------------------------------------------------
async function projects() {
  const data = await api("projects");
  const rows = data.flatMap(p => p.models.map(m => el("tr", {},
    el("td", {}, p.project), el("td", {}, m.model ? link("model", { project: p.project, model: m.model }, m.model) : el("span", { class: "muted" }, "(no trainable model)")),
    el("td", {}, m.base_model || "–"), el("td", {}, m.runs ?? "–"), el("td", {}, m.last_step ?? "–"),
    el("td", {}, link("trajectories", { project: p.project, ...(m.model ? { model: m.model } : {}) }, m.trajectories)))));
  main.replaceChildren(el("h1", {}, "Projects and models"), data.length ? el("table", { id: "projects" },
    el("tr", {}, ...["project", "model", "base model", "runs", "last step", "trajectories"].map(h => el("th", {}, h))), rows)
    : el("p", { class: "muted" }, "The store is empty: run some rollouts first."));
}

// -- a model: what was learned -------------------------------------------------------------
// Charts of lines over steps. The first line is the main one (a band: its spread); `more` adds
// named lines (reward parts, an evaluation's figures) shown or hidden from the legend;
// `marks` shades steps (the warm-up's). A metric that is 0 at every step is said so, not drawn.
const PALETTE = ["#3b6fd9", "#d9822b", "#2a9d6f", "#b5459b", "#8a6d3b", "#5c6bc0", "#c0392b"];
const hiddenLines = new Set();  // "chart/line" the reader hid; kept while the page refreshes

function lineChart(title, points, opts = {}) {
  const W = 320, H = 170, L = 36, R = 8, T = 10, B = 22;
  const id = opts.id || title;
  const lines = [{ name: opts.name || title, points, main: true }, ...(opts.more || [])]
    .map((s, i) => ({ ...s, color: PALETTE[i % PALETTE.length], key: `${id}/${s.name}` }));
  const all = lines.flatMap(s => s.points);
  const xs = all.map(p => p.x).concat(opts.marks || []);
  const ys = all.flatMap(p => [p.y, p.lo ?? p.y, p.hi ?? p.y]).filter(v => v !== null && v !== undefined && !Number.isNaN(v));
  const box = el("div", { class: "chart card", "data-chart": id }, el("h3", {}, title));
  if (!all.length || !ys.length) { box.append(el("p", { class: "muted" }, opts.empty || "no data yet")); return box; }
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
  const sx = x => L + (x1 === x0 ? (W - L - R) / 2 : (x - x0) / (x1 - x0) * (W - L - R));
  const sy = y => T + (y1 === y0 ? (H - T - B) / 2 : (1 - (y - y0) / (y1 - y0)) * (H - T - B));
  const g = svg("svg", { viewBox: `0 0 ${W} ${H}` });
  const half = x1 === x0 ? 10 : Math.min(Math.max((W - L - R) / (x1 - x0) / 2, 3), 10);
  for (const m of opts.marks || []) {  // a warm-up step: shaded behind the lines, inside the axes
    const left = Math.max(L, sx(m) - half), right = Math.min(W - R, sx(m) + half);
    g.append(svg("rect", { class: "warmup", x: left, y: T, width: right - left, height: H - T - B, "data-step": m },
      svg("title", {}, `step ${m}: made by the supervised warm-up`)));
  }
  g.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }), svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }),
    svg("text", { x: 2, y: T + 8 }, fmt(y1, 2)), svg("text", { x: 2, y: H - B }, fmt(y0, 2)),
    svg("text", { x: L, y: H - 6 }, "step " + x0), svg("text", { x: W - R - 40, y: H - 6 }, "step " + x1));
  for (const s of lines.slice().reverse()) {  // the main line on top
    const shown = s.main ? !hiddenLines.has(s.key) : (s.shown ?? true) !== hiddenLines.has(s.key);
    const grp = svg("g", { class: "series" + (s.main ? " main" : ""), "data-line": s.name, style: `color: ${s.color}`, ...(shown ? {} : { display: "none" }) });
    if (s.main && s.points.some(p => p.lo !== undefined)) {
      const up = s.points.map(p => `${sx(p.x)},${sy(p.hi)}`), down = s.points.slice().reverse().map(p => `${sx(p.x)},${sy(p.lo)}`);
      grp.append(svg("polygon", { class: "band", points: up.concat(down).join(" ") }));
    }
    grp.append(svg("polyline", { class: "line", points: s.points.map(p => `${sx(p.x)},${sy(p.y)}`).join(" ") }));
    for (const p of s.points) {
      const c = svg("circle", { class: "pt", cx: sx(p.x), cy: sy(p.y), r: s.main ? 3.5 : 2.5, "data-step": p.x },
        svg("title", {}, `step ${p.x}: ${s.name} ${fmt(p.y)}` + (p.lo !== undefined ? ` (${fmt(p.lo)} to ${fmt(p.hi)})` : "")));
      if (opts.onclick) c.addEventListener("click", () => opts.onclick(p));
      grp.append(c);
    }
    g.append(grp);
  }
  box.append(g);
  if (lines.length > 1 || (opts.marks || []).length) {  // lines to show or hide, and what the shading means
    const legend = el("div", { class: "legend" }, lines.length < 2 ? null : lines.map(s => el("label", { "data-line": s.name },
      el("input", { type: "checkbox", ...((s.main ? !hiddenLines.has(s.key) : (s.shown ?? true) !== hiddenLines.has(s.key)) ? { checked: "" } : {}),
        onchange: e => {
          const wanted = e.target.checked, byDefault = s.main || (s.shown ?? true);
          if (wanted === byDefault) hiddenLines.delete(s.key); else hiddenLines.add(s.key);
          const grp = g.querySelector(`g.series[data-line="${CSS.escape(s.name)}"]`);
          if (wanted) grp.removeAttribute("display"); else grp.setAttribute("display", "none");
        } }),
      el("span", { class: "swatch", style: `background: ${s.color}` }), s.name)),
      (opts.marks || []).length ? el("span", { class: "muted" }, el("span", { class: "swatch warmup" }), "warm-up") : null);
    box.append(legend);
  }
  return box;
}

// a step's metric as a chart; one with a single value (one step, or the same at every step)
// said in words: a flat line has no scale to read
const exact = x => (x !== 0 && Math.abs(x) < 1e-3) ? Number(x).toExponential(2) : fmt(x);
function metricChart(rows, name, title, marks, id = name) {
  const pts = rows.filter(m => typeof m[name] === "number").map(m => ({ x: m.step, y: m[name] }));
  if (pts.length && pts.every(q => q.y === pts[0].y))
    return el("div", { class: "chart card flat", "data-chart": id }, el("h3", {}, title),
      el("p", { class: "flatvalue" }, pts.length > 1 ? `${exact(pts[0].y)} at every step` : `${exact(pts[0].y)} at step ${pts[0].x}`),
      el("p", { class: "muted" }, pts.length > 1 ? `steps ${pts[0].x}–${pts[pts.length - 1].x}` : "one step so far"));
  return lineChart(title, pts, { id, marks });
}

// evaluations' figures, filed with the step as eval/<name>/<figure>: one chart per evaluation
function evaluationCharts(metrics, marks) {
  const names = [...new Set(metrics.flatMap(m => Object.keys(m)).map(k => (/^eval\/(.+)\/reward$/.exec(k) || [])[1]).filter(Boolean))];
  return names.map(name => {
    const pre = `eval/${name}/`, rows = metrics.filter(m => typeof m[pre + "reward"] === "number");
    const main = rows.map(m => {
      const y = m[pre + "reward"], se = m[pre + "reward_se"];
      return typeof se === "number" ? { x: m.step, y, lo: y - se, hi: y + se } : { x: m.step, y };
    });
    const extra = [...new Set(rows.flatMap(m => Object.keys(m)).filter(k => k.startsWith(pre)).map(k => k.slice(pre.length))
      .filter(k => !["reward", "reward_se", "scenarios", "failed"].includes(k)))].sort();
    const more = extra.map(k => ({ name: k.replace(/^part\//, "part: "), shown: false,
      points: rows.filter(m => typeof m[pre + k] === "number").map(m => ({ x: m.step, y: m[pre + k] })) }));
    const n = rows.length ? rows[rows.length - 1][pre + "scenarios"] : 0;
    return lineChart(`evaluation “${name}”: mean reward on ${n} scenarios (band: ± one standard error)`, main,
      { id: "eval-" + name, name: "reward", more, marks });
  });
}

async function model(p) {
  const draw = async () => {
    const data = await api("curve", { project: p.project, model: p.model, ...inRun(p) });
    const run = { run: data.run ?? "" };  // the run shown: the one asked for, else the newest
    setCrumbs({ ...p, ...run });
    const warmup = data.metrics.filter(m => m.sft).map(m => m.step);
    const grpo = data.metrics.filter(m => !m.sft), sft = data.metrics.filter(m => m.sft && typeof m.loss === "number");
    const untrained = data.metrics.filter(m => m.untrained_batches);
    const pts = data.points.filter(q => q.mean !== null);
    const partNames = [...new Set(data.parts.map(q => q.name))];
    const curve = lineChart("training reward: mean per step (band: ± one std)", pts.map(q => ({ x: q.step, y: q.mean, lo: q.mean - (q.std || 0), hi: q.mean + (q.std || 0) })),
      { id: "reward", name: "total", marks: warmup,
        more: partNames.map(n => ({ name: n, shown: false, points: data.parts.filter(q => q.name === n).map(q => ({ x: q.step, y: q.mean })) })),
        onclick: q => location.hash = "#/step?" + new URLSearchParams({ project: p.project, model: p.model, step: q.x, ...run }) });
    const runs = el("select", { id: "run", onchange: e => location.hash = "#/model?" + new URLSearchParams({ project: p.project, model: p.model, run: e.target.value }) },
      data.runs.map(r => el("option", { value: r.run, ...(r.run === run.run ? { selected: "" } : {}) },
        `${r.run || "(before runs)"} · ${r.last_step ?? 0} steps · ${r.trajectories} trajectories`)));
    const byStep = Object.fromEntries(data.metrics.map(m => [m.step, m]));
    const notes = s => {
      const m = byStep[s] || {};
      return [m.sft ? el("span", { class: "flag warmup" }, "warm-up") : null,
              m.untrained_batches ? el("span", { class: "flag nosignal", title: m.untrained_reason || "" }, "trained nothing") : null];
    };
    const table = el("table", { id: "steps" }, el("tr", {}, ...["step", "trajectories", "mean", "std", "min", "max", "failed", "", ""].map(h => el("th", {}, h))),
      data.points.map(q => el("tr", {}, el("td", {}, q.step), el("td", {}, q.n), el("td", {}, fmt(q.mean)), el("td", {}, fmt(q.std)),
        el("td", {}, fmt(q.min)), el("td", {}, fmt(q.max)), el("td", {}, q.errors || ""), el("td", {}, notes(q.step)),
        el("td", {}, link("step", { project: p.project, model: p.model, step: q.step }, "groups"), " ",
          link("trajectories", { project: p.project, model: p.model, ...run, min_step: q.step, max_step: q.step }, "trajectories")))));
    const nothing = untrained.length ? [el("h2", {}, "Batches that trained nothing"),
      el("table", { id: "untrained" }, el("tr", {}, ...["at step", "batches", "why"].map(h => el("th", {}, h))),
        untrained.map(m => el("tr", {}, el("td", {}, link("step", { project: p.project, model: p.model, step: m.step, ...run }, m.step)),
          el("td", {}, m.untrained_batches), el("td", {}, m.untrained_reason || "–"))))] : [];
    main.replaceChildren(el("h1", {}, `${p.model} — what was learned`),
      data.runs.length ? el("label", { class: "filters" }, "run ", runs) : null,
      el("div", { class: "charts" }, curve, ...evaluationCharts(data.metrics, warmup),
        metricChart(grpo, "loss", "loss (GRPO steps)"), sft.length ? metricChart(sft, "loss", "loss (warm-up steps)", [], "sft_loss") : null,
        metricChart(grpo, "clip_fraction", "clip fraction", warmup), metricChart(grpo, "kl", "KL", warmup),
        metricChart(data.metrics, "tokens_trained", "tokens trained", warmup), metricChart(data.metrics, "seconds", "seconds per step", warmup)),
      ...nothing, el("h2", {}, "Steps"), table);
  };
  await draw();
  refresh = setInterval(() => draw().catch(() => {}), 5000); // the curve moves while a run is going
}

// -- a step: its groups --------------------------------------------------------------------
async function step(p) {
  setCrumbs(p);
  const offset = Number(p.offset || 0);
  const data = await api("groups", { project: p.project, model: p.model, step: p.step, offset, ...inRun(p) });
  const rows = data.groups.map(g => el("tr", { class: "group" + (g.no_signal ? " nosignal" : "") },
    el("td", {}, el("code", {}, JSON.stringify(g.scenario).slice(0, 120)), g.no_signal ? el("span", { class: "flag nosignal" }, "no signal") : null),
    el("td", {}, fmt(g.reward_mean), " ± ", fmt(g.reward_std)),
    el("td", {}, g.trajectories.map(t => el("div", {}, link("trajectory", { id: t.id }, `#${t.group_index}`), " ", fmt(t.reward),
      Object.keys(t.rewards).length ? el("span", { class: "muted" }, " (" + Object.entries(t.rewards).map(([k, v]) => `${k} ${fmt(v, 2)}`).join(", ") + ")") : null,
      t.error_type ? el("span", { class: "flag error", title: t.error_message || "" }, t.error_type) : null,
      t.incomplete ? el("span", { class: "flag incomplete" }, "incomplete") : null))),
    el("td", {}, link("compare", { project: p.project, model: p.model, ...inRun(p), scenario: JSON.stringify(g.arguments), a: 0, b: p.step }, "compare with step 0"))));
  main.replaceChildren(el("h1", {}, `Step ${p.step}: ${data.total} groups`),
    el("table", { id: "groups" }, el("tr", {}, ...["scenario", "reward", "trajectories (reward, parts, flags)", ""].map(h => el("th", {}, h))), rows),
    pager(data, "step", p));
}

function pager(data, view, p) {
  const prev = data.offset > 0 ? link(view, { ...p, offset: Math.max(0, data.offset - data.limit) }, "← previous") : null;
  const next = data.offset + data.limit < data.total ? link(view, { ...p, offset: data.offset + data.limit }, "next →") : null;
  return el("div", { class: "pager" }, prev, el("span", { class: "muted" }, `${data.offset + 1}–${Math.min(data.offset + data.limit, data.total)} of ${data.total}`), next);
}

// -- trajectories: filters and a page ------------------------------------------------------
async function trajectories(p) {
  setCrumbs({ project: p.project, model: p.model, ...inRun(p) });
  const data = await api("trajectories", p);
  const field = (name, label) => el("label", {}, label, el("input", { name, value: p[name] || "" }));
  const form = el("form", { class: "filters", id: "filters", onsubmit: e => {
    e.preventDefault();
    const f = Object.fromEntries(new FormData(e.target).entries());
    if (!f.errors) delete f.errors;
    location.hash = "#/trajectories?" + new URLSearchParams(Object.entries(f).filter(([, v]) => v !== ""));
  } }, field("project", "project"), field("model", "model"), field("run", "run"), field("rollout", "rollout"), field("min_step", "step from"),
    field("max_step", "step to"), field("min_reward", "reward from"), field("max_reward", "reward to"),
    el("label", {}, "errors only", el("input", { type: "checkbox", name: "errors", value: "true", ...(p.errors ? { checked: "" } : {}) })),
    el("button", { type: "submit" }, "filter"));
  const rows = data.rows.map(t => el("tr", { class: "traj" }, el("td", {}, link("trajectory", { id: t.id }, t.id.slice(0, 10))),
    el("td", {}, t.rollout), el("td", {}, t.model || "–"), el("td", {}, t.run || "–"), el("td", {}, t.step ?? "–"), el("td", {}, fmt(t.reward)),
    el("td", {}, t.n_calls), el("td", {}, t.error_type ? el("span", { class: "flag error", title: t.error_message || "" }, t.error_type) : ""),
    el("td", {}, new Date(t.started_at * 1000).toLocaleString())));
  main.replaceChildren(el("h1", {}, `Trajectories (${data.total})`), form,
    el("table", { id: "trajectories" }, el("tr", {}, ...["id", "rollout", "model", "run", "step", "reward", "calls", "", "started"].map(h => el("th", {}, h))), rows),
    pager(data, "trajectories", p));
}

// -- one trajectory as a chat ----------------------------------------------------------------
// stored shapes vary (other clients, custom tool calls, hand-made trajectories): whatever is not
// the usual shape is shown as its JSON, never an error
function raw(x) {
  try { return JSON.stringify(x) ?? String(x); } catch (e) { return String(x); }
}

function content(c) {
  if (c === null || c === undefined) return "";
  if (typeof c === "string") return c;
  if (!Array.isArray(c)) return raw(c);
  return c.map(part => (part && typeof part === "object" && typeof part.text === "string") ? part.text : raw(part)).join("");
}

function toolCall(tc) {
  const fn = tc && typeof tc === "object" ? tc.function : null;
  const id = tc && typeof tc === "object" && typeof tc.id === "string" ? `  [${tc.id}]` : "";
  if (!fn || typeof fn !== "object") return `→ ${raw(tc)}`;
  const args = typeof fn.arguments === "string" ? fn.arguments : raw(fn.arguments ?? {});
  return `→ ${typeof fn.name === "string" ? fn.name : raw(fn.name)}(${args})` + id;
}

function message(m) {
  if (!m || typeof m !== "object") return el("div", { class: "msg" }, raw(m));
  const role = typeof m.role === "string" ? m.role : "?";
  const box = el("div", { class: "msg " + role.replace(/[^a-z_-]/gi, "") }, el("span", { class: "role" },
    role + (m.tool_call_id ? ` (${typeof m.tool_call_id === "string" ? m.tool_call_id : raw(m.tool_call_id)})` : "")),
    content(m.content));
  const calls = Array.isArray(m.tool_calls) ? m.tool_calls : (m.tool_calls ? [m.tool_calls] : []);
  for (const tc of calls) box.append(el("div", { class: "toolcall" }, toolCall(tc)));
  return box;
}

function tokens(choice) {
  if (!choice.token_ids || !choice.logprobs) return null;
  const texts = choice.token_texts || choice.token_ids.map(i => `⟨${i}⟩`);
  return el("div", { class: "tokens" }, texts.map((t, i) => {
    const p = Math.exp(choice.logprobs[i]);  // likely tokens pale, unlikely ones red
    return el("span", { class: "tok", style: `background: rgba(192,57,43,${(1 - p) * 0.55})`, title: `id ${choice.token_ids[i]} · logprob ${fmt(choice.logprobs[i])} · p ${fmt(p)}` }, t);
  }));
}

function chat(t) {
  const out = [];
  let shown = 0, lastAnswer = null; // each call repeats the conversation so far: show only what is new
  for (const call of t.calls) {
    out.push(el("div", { class: "callhead" }, `call ${call.index}: ${call.provider} → ${call.served_by || call.model}`,
      ` · ${fmt(call.latency * 1000, 0)} ms`, call.stream ? " · streamed" : "",
      call.provider === "endpoint" ? el("span", { class: "flag endpoint", title: "no client artsdk patches recorded it: added from the endpoint's own record" }, "from the endpoint") : null,
      call.incomplete ? el("span", { class: "flag incomplete" }, "incomplete") : null, call.error ? el("span", { class: "flag error" }, call.error) : null));
    let from = call.messages.length >= shown ? shown : 0;
    // the previous answer as the agent sent it back (with the tool calls it parsed, say): shown when it differs
    const resent = from > 0 ? call.messages[from - 1] : null;
    if (resent && lastAnswer && (JSON.stringify(resent.tool_calls || null) !== JSON.stringify(lastAnswer.tool_calls || null)
                                 || content(resent.content) !== content(lastAnswer.content))) from -= 1;
    out.push(...call.messages.slice(from).map(message));
    const choice = call.choices[0];
    if (choice) { out.push(message(choice.message)); const toks = tokens(choice); if (toks) out.push(toks); }
    shown = call.messages.length + (choice ? 1 : 0);
    lastAnswer = choice ? choice.message : null;
  }
  return el("div", { class: "chat" }, out);
}

async function trajectory(p) {
  const t = await api("trajectories/" + encodeURIComponent(p.id));
  setCrumbs({ project: t.project, model: t.model, ...(t.run ? { run: t.run } : {}), ...(t.step !== null && t.model ? { step: t.step } : {}) });
  main.replaceChildren(el("h1", {}, `Trajectory ${t.id.slice(0, 10)} — ${t.rollout}`),
    el("div", { class: "card" }, `reward ${fmt(t.reward)}`,
      Object.keys(t.rewards).length ? ` (${Object.entries(t.rewards).map(([k, v]) => `${k} ${fmt(v, 2)}`).join(", ")})` : "",
      ` · step ${t.step ?? "–"} · ${t.calls.length} calls · ${fmt(t.duration, 2)} s`,
      t.error ? el("div", { class: "flag error" }, `${t.error.type}: ${t.error.message}`) : null,
      el("div", { class: "muted" }, "scenario ", el("code", {}, JSON.stringify(t.scenario)), " · outcome ", el("code", {}, JSON.stringify(t.outcome))),
      recorded(t.metadata && t.metadata.calls_recorded),
      related(t.metadata || {}),
      t.warnings.length ? el("div", { class: "muted" }, t.warnings.join(" · ")) : null),
    chat(t));
}

// a rollout run inside another: its calls are on its own trajectory, which the outer one names
function related(m) {
  const to = id => link("trajectory", { id }, id.slice(0, 10));
  const children = Array.isArray(m.children) ? m.children : [];
  if (!m.parent && !children.length) return null;
  return el("div", { class: "muted related" },
    m.parent ? el("span", { class: "parent" }, "run inside ", to(m.parent)) : null,
    m.parent && children.length ? " · " : null,
    children.length ? el("span", { class: "children" }, "rollouts run inside it (their calls are on them): ",
      ...children.flatMap((id, i) => i ? [", ", to(id)] : [to(id)])) : null);
}

// what the client's record and the endpoint's held, and how they matched (artsdk/rollout/reconcile.py)
function recorded(c) {
  if (!c || typeof c !== "object") return null;
  return el("div", { class: "muted recorded" }, `calls recorded: by the client ${c.client} · by the endpoint ${c.endpoint}`,
    ` · matched ${c.matched}`, c.endpoint_only ? el("span", { class: "flag endpoint" }, `${c.endpoint_only} only the endpoint saw`) : null,
    c.client_only ? el("span", { class: "flag error" }, `${c.client_only} only the client saw`) : null);
}

// -- one scenario at two steps ------------------------------------------------------------
async function compare(p) {
  setCrumbs({ project: p.project, model: p.model, ...inRun(p) });
  const data = await api("compare", p);
  const column = (side, stepN) => el("div", { class: "column", "data-side": side }, el("h2", {}, `step ${stepN} (${data[side].length})`),
    data[side].length ? data[side].map(t => el("div", { class: "card" }, link("trajectory", { id: t.id }, t.id.slice(0, 10)), ` reward ${fmt(t.reward)}`, chat(t)))
      : el("p", { class: "muted" }, "no trajectory of this scenario at this step"));
  const pick = el("form", { class: "filters", onsubmit: e => {
    e.preventDefault();
    const f = Object.fromEntries(new FormData(e.target).entries());
    location.hash = "#/compare?" + new URLSearchParams({ ...p, ...f });
  } }, el("label", {}, "step", el("input", { name: "a", value: p.a })), el("label", {}, "against step", el("input", { name: "b", value: p.b })),
    el("button", { type: "submit" }, "compare"));
  main.replaceChildren(el("h1", {}, "Compare: ", el("code", {}, p.scenario)), pick,
    el("div", { class: "columns", id: "compare" }, column("a", p.a), column("b", p.b)));
}
