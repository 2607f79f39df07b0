// The chat page of `max serve`: plain JavaScript, no build step, no network beyond this server.
// Streams answers from /v1/chat/completions (SSE), keeps the conversation and settings in localStorage and
// the API key in sessionStorage (this tab only).  Answers are Markdown: marked turns them into HTML and
// DOMPurify keeps only inert markup (static/vendor), re-rendered as they stream.
"use strict";

const STORE = "libremax-chat-v1";
const KEY_STORE = "libremax-chat-api-key";  // sessionStorage
const $ = (id) => document.getElementById(id);
const SETTINGS = ["system", "temperature", "top_p", "max_tokens", "json_mode", "json_schema"];

let state = { messages: [], settings: {} };
let pendingImages = [];   // data URLs attached to the next message
let controller = null;    // AbortController of the answer being streamed
let model = null;
let vision = false;       // the served model takes images (/v1/models: capabilities.vision)

function load() {
  try { state = Object.assign(state, JSON.parse(localStorage.getItem(STORE) || "{}")); } catch (e) { /* fresh start */ }
  if (!state.settings || typeof state.settings !== "object") state.settings = {};
  if ("api_key" in state.settings) {  // earlier pages kept the key in localStorage: move it to this tab only
    if (state.settings.api_key && !sessionStorage.getItem(KEY_STORE)) sessionStorage.setItem(KEY_STORE, state.settings.api_key);
    delete state.settings.api_key;
    localStorage.setItem(STORE, JSON.stringify(state));
  }
  for (const k of SETTINGS) {
    const el = $(k), v = state.settings[k];
    if (v === undefined) continue;
    if (el.type === "checkbox") el.checked = !!v; else el.value = v;
  }
  $("api_key").value = sessionStorage.getItem(KEY_STORE) || "";
  $("json_schema").hidden = !$("json_mode").checked;
}

function save() {
  for (const k of SETTINGS) {
    const el = $(k);
    state.settings[k] = el.type === "checkbox" ? el.checked : el.value;
  }
  localStorage.setItem(STORE, JSON.stringify(state));
}

function saveKey() {
  const key = $("api_key").value.trim();
  if (key) sessionStorage.setItem(KEY_STORE, key); else sessionStorage.removeItem(KEY_STORE);
}

// Markdown -> sanitised HTML.  Model output is untrusted: DOMPurify drops scripts, event handlers,
// javascript: URLs and the like; on top of it no ids/names (they could shadow this page's elements), no
// styles or forms, images only from data: URLs, links open in a new tab without an opener.  The page's
// CSP (no inline script) is a second wall.
const md = (typeof marked !== "undefined") ? new marked.Marked({ gfm: true, breaks: true }) : null;
const PURIFY = { USE_PROFILES: { html: true },  // HTML only: no SVG or MathML
                 FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select", "option", "iframe", "object",
                               "embed", "link", "meta", "base"],
                 FORBID_ATTR: ["style", "id", "name", "form", "formaction", "srcset"] };
if (md && typeof DOMPurify !== "undefined") {
  DOMPurify.addHook("afterSanitizeAttributes", (node) => {
    if (node.tagName === "A" && node.hasAttribute("href")) {
      node.setAttribute("target", "_blank");
      node.setAttribute("rel", "noopener noreferrer");
    }
    if (node.tagName === "IMG" && !/^data:image\//i.test(node.getAttribute("src") || "")) node.removeAttribute("src");
    if (node.hasAttribute("class")) {  // only marked's code-language classes, never this page's own
      const keep = node.getAttribute("class").split(/\s+/).filter((c) => /^language-[\w+#.-]+$/.test(c));
      if (keep.length) node.setAttribute("class", keep.join(" ")); else node.removeAttribute("class");
    }
  });
}

function renderMarkdown(el, text) {
  if (md && typeof DOMPurify !== "undefined" && DOMPurify.isSupported) {
    el.innerHTML = DOMPurify.sanitize(md.parse(text), PURIFY);
  } else {
    el.textContent = text;  // the libraries did not load: plain text, never raw HTML
    el.classList.add("plain");
  }
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api_key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function showError(msg) {
  const el = $("error");
  el.textContent = msg || "";
  el.hidden = !msg;
}

function statsText(s) {
  if (!s) return "";
  const parts = [`${s.tokens} tokens`];
  if (s.tps !== null && s.tps !== undefined) parts.push(`${s.tps.toFixed(1)} tok/s`);
  if (s.ttft !== null && s.ttft !== undefined) parts.push(`TTFT ${Math.round(s.ttft)} ms`);
  if (s.finish && s.finish !== "stop") parts.push(s.finish === "length" ? "stopped at max tokens" : s.finish);
  return parts.join(" · ");
}

function renderMessage(m, i) {
  const div = document.createElement("div");
  div.className = "msg " + m.role;
  div.dataset.index = i;
  const role = document.createElement("div");
  role.className = "role";
  role.textContent = m.role;
  const text = document.createElement("div");
  text.className = "text";
  if (m.role === "assistant") {
    text.classList.add("md");
    renderMarkdown(text, m.content);
  } else {
    text.textContent = m.content;
  }
  div.append(role, text);
  for (const url of m.images || []) {
    const img = document.createElement("img");
    img.src = url;
    img.alt = "attached image";
    div.append(img);
  }
  if (m.role === "assistant") {
    const st = document.createElement("div");
    st.className = "stats";
    st.textContent = statsText(m.stats);
    div.append(st);
  }
  return div;
}

function render() {
  const box = $("messages");
  box.replaceChildren(...state.messages.map(renderMessage));
  box.scrollTop = box.scrollHeight;
}

function renderAttachments() {
  $("attachments").replaceChildren(...pendingImages.map((url) => {
    const img = document.createElement("img");
    img.src = url;
    img.alt = "image to send";
    return img;
  }));
}

function requestMessages() {
  const out = [];
  const system = $("system").value.trim();
  if (system) out.push({ role: "system", content: system });
  for (const m of state.messages) {
    if (m.role === "user" && m.images && m.images.length) {
      out.push({ role: "user", content: [{ type: "text", text: m.content },
        ...m.images.map((url) => ({ type: "image_url", image_url: { url } }))] });
    } else {
      out.push({ role: m.role, content: m.content });
    }
  }
  return out;
}

function requestBody() {
  const body = { messages: requestMessages(), stream: true, stream_options: { include_usage: true } };
  if (model) body.model = model;
  const num = (id) => { const v = parseFloat($(id).value); return Number.isFinite(v) ? v : undefined; };
  body.temperature = num("temperature");
  body.top_p = num("top_p");
  const mt = parseInt($("max_tokens").value, 10);
  if (Number.isFinite(mt)) body.max_tokens = mt;
  if ($("json_mode").checked) {
    let schema;
    try { schema = JSON.parse($("json_schema").value); } catch (e) { throw new Error("JSON schema: " + e.message); }
    body.response_format = { type: "json_schema", json_schema: { name: "schema", schema } };
  }
  return body;
}

async function errorMessage(resp) {
  try {
    const j = await resp.json();
    if (j && j.error && j.error.message) return `${resp.status}: ${j.error.message}`;
  } catch (e) { /* not JSON */ }
  return `${resp.status} ${resp.statusText}`;
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
}

async function send(text) {
  showError("");
  let body;
  const user = { role: "user", content: text };
  if (pendingImages.length) user.images = pendingImages.slice();
  state.messages.push(user);
  try { body = requestBody(); } catch (e) { state.messages.pop(); showError(e.message); return; }
  const answer = { role: "assistant", content: "", stats: null };
  state.messages.push(answer);
  pendingImages = [];
  renderAttachments();
  $("prompt").value = "";
  render();
  save();
  const node = $("messages").lastElementChild;
  const textNode = node.querySelector(".text"), statsNode = node.querySelector(".stats");
  node.classList.add("streaming");
  setBusy(true);
  controller = new AbortController();
  const t0 = performance.now();
  let tFirst = null, chunks = 0, usage = null, finish = null, frame = null;
  const paint = () => {  // the Markdown of the answer so far, at most once per frame
    frame = null;
    renderMarkdown(textNode, answer.content);
    $("messages").scrollTop = $("messages").scrollHeight;
  };
  const update = () => {
    const now = performance.now();
    const tokens = usage ? usage.completion_tokens : chunks;
    const tps = tFirst !== null && now > tFirst && tokens > 1 ? (tokens - 1) / ((now - tFirst) / 1000) : null;
    answer.stats = { tokens, tps, ttft: tFirst === null ? null : tFirst - t0, finish };
    statsNode.textContent = statsText(answer.stats);
  };
  try {
    const resp = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body),
                                                       signal: controller.signal });
    if (!resp.ok) {
      if (resp.status === 401) refreshModel();  // the label says why
      throw new Error(await errorMessage(resp));
    }
    if (model === null) refreshModel();  // the key works now: name the model, show its capabilities
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") continue;
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message || "generation failed");
          if (j.usage) usage = j.usage;
          const c = j.choices && j.choices[0];
          if (!c) continue;
          const delta = (c.delta && c.delta.content) || "";
          if (delta) {
            if (tFirst === null) tFirst = performance.now();
            chunks += 1;
            answer.content += delta;
            if (frame === null) frame = requestAnimationFrame(paint);
          }
          if (c.finish_reason) finish = c.finish_reason;
        }
      }
      update();
      $("messages").scrollTop = $("messages").scrollHeight;
    }
  } catch (e) {
    if (e.name === "AbortError") {
      finish = "stopped";
    } else {
      showError(e.message);
      if (!answer.content) {  // nothing came back: take the turn back so it can be retried
        state.messages.splice(state.messages.length - 2, 2);
        $("prompt").value = text;
        pendingImages = user.images || [];
        renderAttachments();
        render();
        save();
        setBusy(false);
        controller = null;
        return;
      }
      finish = "error";
    }
  }
  if (frame !== null) cancelAnimationFrame(frame);
  paint();
  update();
  node.classList.remove("streaming");
  node.dataset.finish = finish || "stop";
  controller = null;
  setBusy(false);
  save();
}

function readImage(file) {
  return new Promise((resolve, reject) => {
    const r = new FileReader();
    r.onload = () => resolve(r.result);
    r.onerror = () => reject(r.error);
    r.readAsDataURL(file);
  });
}

function setModelLabel(text) {
  $("model-name").textContent = text;
  $("topbar-model").textContent = text;
}

// the served model, whether it takes images, and whether the API key works
async function refreshModel() {
  let resp;
  try {
    resp = await fetch("/v1/models", { headers: headers() });
  } catch (e) {
    showError("cannot reach the server: " + e.message);
    return;
  }
  if (resp.ok) {
    const j = await resp.json();
    const card = j.data && j.data.length ? j.data[0] : null;
    model = card ? card.id : null;
    vision = !!(card && card.capabilities && card.capabilities.vision);
    setModelLabel(model || "");
  } else {
    model = null;
    vision = false;
    setModelLabel(resp.status === 401 ? ($("api_key").value.trim() ? "(API key rejected)" : "(set the API key)")
                                      : `(${await errorMessage(resp)})`);
  }
  $("attach").hidden = !vision;
  if (!vision && pendingImages.length) { pendingImages = []; renderAttachments(); }
}

function openSettings(open) {
  document.body.classList.toggle("settings-open", open);
  $("toggle-settings").setAttribute("aria-expanded", String(open));
}

async function init() {
  load();
  render();
  setBusy(false);
  for (const k of SETTINGS) $(k).addEventListener("change", save);
  let keyTimer = null;
  $("api_key").addEventListener("input", () => {
    saveKey();
    clearTimeout(keyTimer);
    keyTimer = setTimeout(refreshModel, 300);
  });
  $("toggle-settings").addEventListener("click", () => openSettings(!document.body.classList.contains("settings-open")));
  document.querySelector("main").addEventListener("click", (ev) => {  // the dimmed area closes the drawer
    if (ev.target === ev.currentTarget) openSettings(false);
  });
  document.addEventListener("keydown", (ev) => { if (ev.key === "Escape") openSettings(false); });
  $("json_mode").addEventListener("change", () => { $("json_schema").hidden = !$("json_mode").checked; });
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const text = $("prompt").value.trim();
    if (text && !controller) send(text);
  });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("composer").requestSubmit(); }
  });
  $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
  $("clear").addEventListener("click", () => { state.messages = []; showError(""); save(); render(); });
  $("image").addEventListener("change", async (ev) => {
    for (const f of ev.target.files) pendingImages.push(await readImage(f));
    ev.target.value = "";
    renderAttachments();
  });
  await refreshModel();
  document.body.dataset.ready = "1";
}

init();
