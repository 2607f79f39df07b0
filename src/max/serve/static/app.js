// The chat page of `max serve`: plain JavaScript, no build step, no network beyond this server.
// Streams answers from /v1/chat/completions (SSE), keeps the conversation and settings in localStorage.
"use strict";

const STORE = "libremax-chat-v1";
const $ = (id) => document.getElementById(id);
const SETTINGS = ["system", "temperature", "top_p", "max_tokens", "json_mode", "json_schema", "api_key"];

let state = { messages: [], settings: {} };
let pendingImages = [];   // data URLs attached to the next message
let controller = null;    // AbortController of the answer being streamed
let model = null;

function load() {
  try { state = Object.assign(state, JSON.parse(localStorage.getItem(STORE) || "{}")); } catch (e) { /* fresh start */ }
  for (const k of SETTINGS) {
    const el = $(k), v = state.settings[k];
    if (v === undefined) continue;
    if (el.type === "checkbox") el.checked = !!v; else el.value = v;
  }
  $("json_schema").hidden = !$("json_mode").checked;
}

function save() {
  for (const k of SETTINGS) {
    const el = $(k);
    state.settings[k] = el.type === "checkbox" ? el.checked : el.value;
  }
  localStorage.setItem(STORE, JSON.stringify(state));
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
  text.textContent = m.content;
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
  let tFirst = null, chunks = 0, usage = null, finish = null;
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
    if (!resp.ok) throw new Error(await errorMessage(resp));
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
            textNode.textContent = answer.content;
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

async function init() {
  load();
  render();
  setBusy(false);
  for (const k of SETTINGS) $(k).addEventListener("change", save);
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
  try {
    const resp = await fetch("/v1/models", { headers: headers() });
    if (resp.ok) {
      const j = await resp.json();
      model = j.data && j.data.length ? j.data[0].id : null;
      $("model-name").textContent = model || "";
    } else {
      $("model-name").textContent = "(set the API key)";
    }
  } catch (e) { showError("cannot reach the server: " + e.message); }
  document.body.dataset.ready = "1";
}

init();
