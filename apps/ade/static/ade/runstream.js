// What the pages that follow runs live share (conversation.js, group.js): small DOM helpers, the rendering
// of the events both draw alike (token deltas grow the assistant text, reasoning and tool-call arguments in
// place; the finished messages replace them), and `follow`, a run's socket on the WebSocket relay
// (ws/runs/<id>/?after=<cursor>) that reconnects from the last cursor it saw, with backoff.
//
// It also reconnects when the socket goes silent. The relay sends a ping after 15 s without events, so a
// socket that hears nothing for SILENCE_MS is dead though not closed: its web host vanished without a FIN
// (power, network), and the browser's WebSocket has no read timeout of its own (it would wait minutes for
// TCP to give up). `data-ws-silence-ms` on <body> overrides it.
(() => {
  if (window.adeRunStream) return;
  const SILENCE_MS = 35000;
  const REFUSED = new Set([4400, 4401, 4404, 4429]); // the relay's close codes: bad cursor, signed out, not visible, too many

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "open") node.open = true;
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const sel = (value) => CSS.escape(String(value));

  // --- rendering ------------------------------------------------------------------------------------
  function part(body, cls, id, build) {
    let node = id ? body.querySelector(`.${cls}[data-msg-id="${sel(id)}"]`) : null;
    if (!node) { node = build(); body.append(node); }
    return node;
  }
  const bubble = (cls, id) => () => el("div", { class: `ev ${cls}`, "data-msg-id": id }, el("div", { class: "bubble" }));
  const reasoningBox = (id) => () => el("details", { class: "ev ev-reasoning", "data-msg-id": id, open: true },
    el("summary", {}, el("span", { class: "ev-label" }, "Reasoning")), el("div", { class: "ev-text" }));
  function toolCallBox(body, callId, name) {
    let node = body.querySelector(`.ev-tool-call[data-call-id="${sel(callId)}"]`);
    if (!node) {
      node = el("details", { class: "ev ev-tool-call", "data-call-id": callId, open: true },
        el("summary", {}, el("span", { class: "ev-label" }, "Tool call"), " ", el("code", { class: "tool-name" }, name || "")),
        el("pre", { class: "json" }));
      body.append(node);
    }
    if (name) node.querySelector(".tool-name").textContent = name;
    return node;
  }

  // The events both pages draw the same way; false for any other (the page draws it). `formatArgs` turns
  // a finished tool call's arguments into the text shown.
  function renderShared(body, event, formatArgs = (text) => text) {
    switch (event.message_type) {
      case "delta": {
        const id = event.message_id || `${event.step_id}`;
        if (event.kind === "content") {
          const node = part(body, "ev-assistant", id, bubble("ev-assistant", id));
          node.classList.add("streaming");
          node.querySelector(".bubble").textContent += event.text || "";
        } else if (event.kind === "reasoning") {
          part(body, "ev-reasoning", id, reasoningBox(id)).querySelector(".ev-text").textContent += event.text || "";
        } else if (event.kind === "tool_call_args" && event.tool_call_id) {
          toolCallBox(body, event.tool_call_id, event.tool_name).querySelector("pre").textContent += event.text || "";
        }
        return true;
      }
      case "assistant_message": {
        const node = part(body, "ev-assistant", event.id, bubble("ev-assistant", event.id));
        node.classList.remove("streaming");
        node.querySelector(".bubble").textContent = event.content || "";
        return true;
      }
      case "reasoning_message":
        part(body, "ev-reasoning", event.id, reasoningBox(event.id)).querySelector(".ev-text").textContent = event.reasoning || "";
        return true;
      case "tool_call_message": {
        const call = event.tool_call || {};
        toolCallBox(body, call.tool_call_id, call.name).querySelector("pre").textContent = formatArgs(call.arguments || "{}");
        return true;
      }
      case "error_message":
        body.append(el("div", { class: "msg msg-error" }, event.message || event.detail || "The run failed."));
        return true;
      default:
        return false;
    }
  }

  // --- a run's socket -------------------------------------------------------------------------------
  // handlers: onEvent(event) for each stream event (the run's end included, after which the socket is
  // done), onPing() when the relay says the stream is quiet, onRetry(retries) when it reconnects,
  // onRefused(code) when the relay refuses it for good. Returns {stop(), ws, cursor}.
  function follow(runId, after, handlers) {
    const state = { cursor: after || "0-0", retries: 0, ws: null, timer: null, watchdog: null, heard: 0, stopped: false };
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const silenceMs = () => Number(document.body?.dataset.wsSilenceMs) || SILENCE_MS;

    function stop() {
      state.stopped = true;
      clearTimeout(state.timer);
      clearInterval(state.watchdog);
      try { state.ws?.close(); } catch (_) { /* closed */ }
    }
    function retry() {
      clearInterval(state.watchdog);
      state.ws = null;
      state.retries += 1;
      state.timer = setTimeout(() => { if (!state.stopped) connect(); }, Math.min(5000, 300 * 2 ** Math.min(state.retries, 5)));
      handlers.onRetry?.(state.retries);
    }
    // Checked every second rather than armed per message, so a changed data-ws-silence-ms applies at once.
    function watch(ws) {
      state.heard = Date.now();
      clearInterval(state.watchdog);
      state.watchdog = setInterval(() => {
        if (state.stopped || state.ws !== ws) { clearInterval(state.watchdog); return; }
        if (Date.now() - state.heard < silenceMs()) return;
        ws.onclose = null; // dead but not closed: drop it without waiting for its close
        ws.onmessage = null;
        try { ws.close(); } catch (_) { /* closed */ }
        retry();
      }, 1000);
    }
    function connect() {
      const ws = new WebSocket(`${scheme}//${location.host}/ws/runs/${encodeURIComponent(runId)}/?after=${encodeURIComponent(state.cursor)}`);
      state.ws = ws;
      watch(ws);
      ws.onopen = () => { state.retries = 0; handlers.onOpen?.(); };
      ws.onmessage = (message) => {
        if (state.stopped || state.ws !== ws) return;
        state.heard = Date.now();
        let data;
        try { data = JSON.parse(message.data); } catch (_) { return; }
        if (data.type === "ping") { handlers.onPing?.(); return; }
        if (!data.event) return;
        if (data.cursor) state.cursor = data.cursor;
        if (data.event.message_type === "run_end") stop(); // the relay closes after it
        handlers.onEvent(data.event);
      };
      ws.onclose = (close) => {
        if (state.stopped || state.ws !== ws) return;
        if (REFUSED.has(close.code)) { stop(); handlers.onRefused?.(close.code); return; }
        retry();
      };
    }

    connect();
    return { stop, get ws() { return state.ws; }, get cursor() { return state.cursor; } };
  }

  window.adeRunStream = { el, sel, part, bubble, reasoningBox, toolCallBox, renderShared, follow };
})();
