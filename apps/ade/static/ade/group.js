// The group page (views/groups.py): streams each live turn. A turn's partial names the run of its current
// speaker (data-run-id, data-speaker); the page follows that run over the run WebSocket relay
// (ws/runs/<id>/?after=<cursor>, as conversation.js does), rendering its events as they arrive under the
// speaker's name. When the run ends it takes the turn's partial again (the server's rendering of all that
// was said so far) and follows the next speaker's run it names, until the turn is over. The socket's
// ping (every 15 s of silence) makes it check the partial too: a run cancelled before it started never
// writes an end event. The markup mirrors ade/groups/_speaker_event.html.
(() => {
  if (window.adeGroup) return;
  const followed = new Map(); // turn id -> {runId, ws, cursor, retries, timer}

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === undefined || value === null || value === false) continue;
      if (key === "class") node.className = value;
      else node.setAttribute(key, value === true ? "" : value);
    }
    for (const child of children) {
      if (child !== null && child !== undefined) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }
  const sel = (value) => CSS.escape(String(value));
  const turnEl = (turnId) => document.getElementById(`turn-${turnId}`);
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  function emit(name, detail) { document.body.dispatchEvent(new CustomEvent(name, { detail })); }

  // --- rendering the speaker's events --------------------------------------------------------------
  function speakerBody(turn, runId) {
    const stream = turn.querySelector("[data-role=stream]");
    if (!stream) return null;
    let box = stream.querySelector(`.group-msg[data-run-id="${sel(runId)}"]`);
    if (!box) {
      box = el("div", { class: "group-msg live-speaker", "data-run-id": runId, "data-speaker-id": turn.dataset.speakerId || "", "data-testid": "group-message" },
        turn.dataset.speaker ? el("div", { class: "ev-label speaker", "data-testid": "speaker" }, turn.dataset.speaker) : null,
        el("div", { class: "speaker-body" }));
      stream.append(box);
    }
    return box.querySelector(".speaker-body");
  }
  function part(body, cls, id, build) {
    let node = body.querySelector(`.${cls}[data-msg-id="${sel(id)}"]`);
    if (!node) { node = build(); body.append(node); }
    return node;
  }
  const bubble = (cls, id) => () => el("div", { class: `ev ${cls}`, "data-msg-id": id }, el("div", { class: "bubble" }));
  const reasoning = (id) => () => el("details", { class: "ev ev-reasoning", "data-msg-id": id, open: true },
    el("summary", {}, el("span", { class: "ev-label" }, "Reasoning")), el("div", { class: "ev-text" }));
  function toolCall(body, callId, name) {
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

  function render(body, event) {
    switch (event.message_type) {
      case "delta": {
        const id = event.message_id || `${event.step_id}`;
        if (event.kind === "content") {
          const node = part(body, "ev-assistant", id, bubble("ev-assistant", id));
          node.classList.add("streaming");
          node.querySelector(".bubble").textContent += event.text || "";
        } else if (event.kind === "reasoning") {
          part(body, "ev-reasoning", id, reasoning(id)).querySelector(".ev-text").textContent += event.text || "";
        } else if (event.kind === "tool_call_args" && event.tool_call_id) {
          toolCall(body, event.tool_call_id, event.tool_name).querySelector("pre").textContent += event.text || "";
        }
        break;
      }
      case "assistant_message": {
        const node = part(body, "ev-assistant", event.id, bubble("ev-assistant", event.id));
        node.classList.remove("streaming");
        node.querySelector(".bubble").textContent = event.content || "";
        break;
      }
      case "reasoning_message":
        part(body, "ev-reasoning", event.id, reasoning(event.id)).querySelector(".ev-text").textContent = event.reasoning || "";
        break;
      case "tool_call_message": {
        const call = event.tool_call || {};
        toolCall(body, call.tool_call_id, call.name).querySelector("pre").textContent = call.arguments || "{}";
        break;
      }
      case "tool_return_message":
        body.append(el("details", { class: "ev ev-tool-return", "data-call-id": event.tool_call_id },
          el("summary", {}, el("span", { class: "ev-label" }, "Tool return"), " ", el("code", { class: "tool-name" }, event.name || "")),
          el("pre", { class: "json" }, event.tool_return || "")));
        break;
      case "error_message":
        body.append(el("div", { class: "msg msg-error" }, event.message || event.detail || "The run failed."));
        break;
      default: break;
    }
  }

  // --- the turn's partial: the next speaker, or the end -----------------------------------------------
  async function refresh(turn) {
    try {
      const response = await fetch(turn.dataset.turnUrl, { headers: { "HX-Request": "true" }, credentials: "same-origin" });
      if (!response.ok) return null;
      const holder = document.createElement("template");
      holder.innerHTML = (await response.text()).trim();
      return holder.content.firstElementChild;
    } catch (_) { return null; }
  }

  function swap(turn, fresh) {
    const box = document.getElementById("group-timeline");
    const stick = box && box.scrollHeight - box.scrollTop - box.clientHeight < 120;
    turn.replaceWith(fresh);
    if (window.htmx) window.htmx.process(fresh);
    if (box && stick) box.scrollTop = box.scrollHeight;
  }

  // After `endedRunId` ended (or on a ping, once): take the partial until it names another run or the
  // turn is over (the turn moves on a moment after its speaker's end event; its first speaker waits for a
  // worker), backing off to one try every 2 s, then follow what it names.
  async function moveOn(turnId, endedRunId, tries = Infinity) {
    for (let i = 0; i < tries; i++) {
      const turn = turnEl(turnId);
      if (!turn || !turn.dataset.live) return;
      const fresh = await refresh(turn);
      if (fresh && (!fresh.dataset.live || fresh.dataset.runId !== endedRunId)) {
        if (turnEl(turnId) !== turn) return; // replaced meanwhile (cancel)
        stop(turnId);
        swap(turn, fresh);
        if (!fresh.dataset.live) emit("ade:group-turn-end", { turn_id: turnId, status: fresh.dataset.status });
        follow(fresh);
        return;
      }
      if (i + 1 < tries) await sleep(Math.min(2000, 250 * 2 ** Math.min(i, 3)));
    }
  }

  // --- following the current speaker's run ----------------------------------------------------------
  function stop(turnId) {
    const entry = followed.get(turnId);
    if (!entry) return;
    followed.delete(turnId);
    clearTimeout(entry.timer);
    try { entry.ws?.close(); } catch (_) { /* closed */ }
  }

  function follow(turn) {
    const turnId = turn.dataset.turnId;
    if (!turn.dataset.live) { stop(turnId); return; }
    const runId = turn.dataset.runId;
    if (!runId) { moveOn(turnId, ""); return; } // no speaker yet: wait for the first
    const current = followed.get(turnId);
    if (current && current.runId === runId) return;
    stop(turnId);
    const entry = { runId, ws: null, cursor: "0-0", retries: 0, timer: null };
    followed.set(turnId, entry);
    connect(turnId, entry);
  }

  function connect(turnId, entry) {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${scheme}//${location.host}/ws/runs/${encodeURIComponent(entry.runId)}/?after=${encodeURIComponent(entry.cursor)}`);
    entry.ws = ws;
    const mine = () => followed.get(turnId) === entry;
    ws.onopen = () => { entry.retries = 0; };
    ws.onmessage = (message) => {
      if (!mine()) return;
      let data;
      try { data = JSON.parse(message.data); } catch (_) { return; }
      if (data.type === "ping") { moveOn(turnId, entry.runId, 1); return; }
      if (!data.event) return;
      if (data.cursor) entry.cursor = data.cursor;
      const event = data.event;
      emit("ade:group-run-event", { turn_id: turnId, run_id: entry.runId, event });
      if (event.message_type === "run_end") { moveOn(turnId, entry.runId); return; }
      const turn = turnEl(turnId);
      const body = turn && speakerBody(turn, entry.runId);
      if (body) render(body, event);
    };
    ws.onclose = (close) => {
      if (!mine()) return;
      if (close.code === 4401 || close.code === 4404 || close.code === 4429) { stop(turnId); return; }
      entry.retries += 1;
      entry.timer = setTimeout(() => { if (mine()) connect(turnId, entry); }, Math.min(5000, 300 * 2 ** Math.min(entry.retries, 5)));
      if (entry.retries >= 3) moveOn(turnId, entry.runId, 1);
    };
  }

  function init(root) {
    const scope = root || document;
    const turns = scope.matches?.(".group-turn") ? [scope] : scope.querySelectorAll?.(".group-turn") || [];
    for (const turn of turns) follow(turn);
    if (turns.length) document.querySelector("#group-timeline [data-testid=group-empty]")?.remove();
  }

  // htmx:load is listened to directly (see conversation.js): a sent turn's partial, or a cancelled one.
  document.addEventListener("htmx:load", (event) => init(event.detail.elt));
  window.adeGroup = { followed };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", () => init(document));
  else init(document);
})();
