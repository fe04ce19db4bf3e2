// The workspace's conversation column: follows each live run over the WebSocket (ws/runs/<id>/?after=<cursor>),
// renders its events as they arrive (token deltas grow the reasoning / assistant text / tool-call arguments
// in place), tells the other columns (`ade:run-event`, `ade:run-end` on document.body), reconnects from
// the last cursor when the socket drops, and swaps in the server's rendering of the turn when the run ends.
// The markup built here mirrors ade/workspace/conversation/_event.html and _turn.html.
(() => {
  if (window.adeConversation) return; // the column partial is swapped in again on conversation switches
  const sockets = new Map(); // run id -> its socket (adeRunStream.follow)
  const STOP_LABELS = {
    end_turn: "Turn ended", tool_rule: "Ended by a tool rule", max_steps: "Step limit reached",
    requires_approval: "Waiting for approval", cancelled: "Cancelled", error: "Error",
    llm_api_error: "LLM provider error", invalid_llm_response: "Invalid LLM response",
  };
  const STOP_TONES = { end_turn: "ok", tool_rule: "ok", max_steps: "warn", requires_approval: "warn", cancelled: "warn" };

  const { el, sel, part, bubble, renderShared } = window.adeRunStream; // ade/runstream.js
  function pretty(text) {
    if (typeof text !== "string") return JSON.stringify(text, null, 2);
    try {
      const value = JSON.parse(text);
      if (value && typeof value === "object") return JSON.stringify(value, null, 2);
    } catch (_) { /* not JSON (yet): shown as it is */ }
    return text;
  }
  function timeline() { return document.getElementById("timeline"); }
  function nearBottom(box) { return box.scrollHeight - box.scrollTop - box.clientHeight < 120; }
  function keepScrolled(fn) {
    const box = timeline();
    const stick = box && nearBottom(box);
    fn();
    if (box && stick) box.scrollTop = box.scrollHeight;
  }
  function emit(name, detail) { document.body.dispatchEvent(new CustomEvent(name, { detail })); }

  // --- rendering one event (the deltas and finished messages both pages draw: runstream.js) -----------
  function renderToolReturn(event) {
    const first = (event.tool_returns || [])[0] || {};
    const meta = [first.sandbox ? `sandbox: ${first.sandbox}` : "", first.duration_ms != null ? `${first.duration_ms} ms` : ""]
      .filter(Boolean).join(" · ");
    const node = el("details", { class: "ev ev-tool-return", "data-call-id": event.tool_call_id },
      el("summary", {}, el("span", { class: "ev-label" }, "Tool return"), " ",
        el("code", { class: "tool-name" }, event.name || ""), " ",
        el("span", { class: `badge ${event.status === "success" ? "ok" : "err"}` }, event.status || ""), " ",
        meta ? el("span", { class: "muted small" }, meta) : null),
      el("pre", { class: "json" }, pretty(event.tool_return || "")));
    if (event.stdout && event.stdout.length) node.append(el("div", { class: "small muted" }, "stdout"), el("pre", {}, event.stdout.join("")));
    if (event.stderr && event.stderr.length) node.append(el("div", { class: "small muted" }, "stderr"), el("pre", { class: "stderr" }, event.stderr.join("")));
    return node;
  }

  function renderApprovalRequest(body, event) {
    const calls = event.tool_calls || [];
    for (const call of calls) body.querySelector(`.ev-tool-call[data-call-id="${sel(call.tool_call_id)}"]`)?.remove();
    const card = el("div", { class: "ev ev-approval pending", id: `approval-${event.id}`, "data-msg-id": event.id, "data-testid": "approval-card" },
      el("div", { class: "approval-head" }, el("span", { class: "ev-label" }, "Approval needed")));
    for (const call of calls) {
      card.append(el("div", { class: "approval-call", "data-call-id": call.tool_call_id },
        el("div", {}, "The agent wants to call ", el("code", { class: "tool-name" }, call.name), " with"),
        el("pre", { class: "json" }, pretty(call.arguments || "{}"))));
    }
    card.append(el("div", { class: "small muted" }, "Loading the decision form…"));
    body.append(card);
  }

  function renderEvent(turn, event) {
    const body = turn.querySelector(".turn-body");
    if (renderShared(body, event, pretty)) return;
    switch (event.message_type) {
      case "tool_return_message": body.append(renderToolReturn(event)); break;
      case "approval_request_message": renderApprovalRequest(body, event); break;
      case "user_message":
        if (!body.querySelector(`.ev-user[data-msg-id="${sel(event.id)}"]`)) {
          const node = bubble("ev-user", event.id)(); node.querySelector(".bubble").textContent = event.content || ""; body.append(node);
        }
        break;
      case "system_message":
        if (!body.querySelector(`.ev-system[data-msg-id="${sel(event.id)}"]`)) {
          const label = event.name === "memory_pressure" ? "Memory pressure" : event.name ? `System alert · ${event.name}` : "System event";
          body.append(el("div", { class: `ev ev-system${event.name ? " ev-alert" : ""}`, "data-msg-id": event.id },
            el("span", { class: "ev-label" }, label), el("div", { class: "ev-text" }, event.content || "")));
        }
        break;
      case "summary_message":
        body.append(el("details", { class: "ev ev-summary", "data-msg-id": event.id },
          el("summary", {}, el("span", { class: "ev-label" }, "Summary"), " Earlier messages were summarised to free the context window"),
          el("div", { class: "ev-text" }, event.summary || "")));
        break;
      case "stop_reason": turn.dataset.stopReason = event.stop_reason || ""; break;
      case "usage_statistics": turn._usage = event; break;
      default: break;
    }
  }

  // --- the footer while the run ends, until the server's rendering replaces the turn -----------------
  function provisionalFoot(turn, stopReason) {
    const foot = turn.querySelector("[data-role=foot]");
    if (!foot) return;
    const usage = turn._usage || {};
    foot.replaceChildren(
      el("span", { class: `badge ${STOP_TONES[stopReason] || "err"}`, "data-testid": "stop-reason" }, STOP_LABELS[stopReason] || stopReason || "Ended"),
      " ",
      el("span", { class: "muted small" }, `${usage.total_tokens ?? 0} tokens · ${usage.step_count ?? 0} steps`));
  }

  async function refreshTurn(turn) {
    const url = turn.dataset.turnUrl;
    if (!url) return null;
    try {
      const response = await fetch(url, { headers: { "HX-Request": "true" }, credentials: "same-origin" });
      if (!response.ok) return null;
      const holder = document.createElement("template");
      holder.innerHTML = (await response.text()).trim();
      return holder.content.firstElementChild;
    } catch (_) { return null; }
  }

  async function finish(turn, status, stopReason) {
    if (turn.dataset.finished) return;
    turn.dataset.finished = "1";
    const runId = turn.dataset.runId;
    const entry = sockets.get(runId);
    if (entry) { sockets.delete(runId); entry.stop(); }
    provisionalFoot(turn, stopReason);
    updateComposer();
    emit("ade:run-end", { run_id: runId, status, stop_reason: stopReason });
    let fresh = await refreshTurn(turn);
    // A run that stopped for approval must come back with its pending approval card: the stream showed
    // it, and the server's rendering can lag behind the stream's end for a moment (seen under load).
    for (let tries = 0; fresh && stopReason === "requires_approval" && !fresh.querySelector(".ev-approval.pending") && tries < 20; tries++) {
      await new Promise((resolve) => setTimeout(resolve, 250));
      fresh = await refreshTurn(turn);
    }
    if (fresh && turn.isConnected) {
      fresh.dataset.finished = "1";
      keepScrolled(() => turn.replaceWith(fresh));
      if (window.htmx) window.htmx.process(fresh);
      if (fresh.dataset.live) { // the database has not caught up yet: follow it again
        delete fresh.dataset.finished;
        follow(fresh);
      }
    }
    updateComposer();
  }

  // When the stream is silent (a ping), or after a cancel, ask the server whether the run is over: a run
  // cancelled before it started, or whose worker died, never writes an end event.
  async function checkTurn(turn) {
    if (turn.dataset.finished || !turn.isConnected) return;
    const fresh = await refreshTurn(turn);
    if (fresh && !fresh.dataset.live && !turn.dataset.finished) {
      finish(turn, fresh.dataset.status, fresh.dataset.stopReason);
    }
  }

  // --- following a run ------------------------------------------------------------------------------
  function follow(turn) {
    const runId = turn.dataset.runId;
    if (!runId || turn.dataset.finished || sockets.has(runId)) return;
    let entry = null;
    const mine = () => sockets.get(runId) === entry;
    entry = window.adeRunStream.follow(runId, turn.dataset.cursor || "0-0", {
      onOpen: () => turn.classList.remove("reconnecting"),
      onPing: () => checkTurn(turn),
      onEvent: (event) => {
        if (!mine()) return;
        turn.dataset.cursor = entry.cursor;
        if (event.message_type === "run_end") {
          finish(turn, event.status, event.stop_reason || turn.dataset.stopReason);
          return;
        }
        keepScrolled(() => renderEvent(turn, event));
        emit("ade:run-event", { run_id: runId, event });
      },
      onRetry: (retries) => {
        if (!turn.isConnected) { if (mine()) sockets.delete(runId); entry.stop(); return; } // swapped out
        turn.classList.add("reconnecting");
        if (retries >= 3) checkTurn(turn);
      },
      onRefused: (code) => {
        if (!mine() || turn.dataset.finished || !turn.isConnected) return;
        sockets.delete(runId);
        const why = { 4400: "This stream could not be resumed: reload the page.", 4401: "Signed out: reload the page.", 4404: "This run is not visible to you.",
          4429: "Too many open streams (MAX_STREAMS_PER_USER): close another tab, then reload." };
        turn.querySelector(".run-state")?.replaceChildren(why[code]);
        updateComposer();
      },
    });
    sockets.set(runId, entry);
    updateComposer();
  }

  // --- the composer -----------------------------------------------------------------------------------
  function activeTurn() {
    return document.querySelector("#timeline .turn[data-live]:not([data-finished])");
  }

  function updateComposer() {
    const form = document.querySelector("#conversation .composer");
    if (!form) return;
    const busy = Boolean(activeTurn());
    form.classList.toggle("busy", busy);
    form.querySelector("textarea").disabled = busy;
    form.querySelector("[data-testid=send]").disabled = busy;
    form.querySelector("[data-action=stop]").hidden = !busy;
    const hint = form.querySelector("[data-role=run-hint]");
    if (hint) hint.hidden = !busy;
    const approvalHint = form.querySelector("[data-role=approval-hint]");
    if (approvalHint) approvalHint.hidden = busy || !document.querySelector("#timeline .approval-form");
    if (!busy && document.activeElement === document.body) form.querySelector("textarea").focus();
  }

  function init(root) {
    const scope = root || document;
    const turns = scope.matches?.(".turn[data-live]") ? [scope] : scope.querySelectorAll?.(".turn[data-live]") || [];
    for (const turn of turns) if (!turn.dataset.finished) follow(turn);
    if (scope.querySelector?.(".turn") || scope.matches?.(".turn")) {
      document.querySelector("#timeline .timeline-empty")?.remove();
    }
    updateComposer();
  }

  document.addEventListener("keydown", (event) => {
    const box = event.target;
    if (!(box instanceof HTMLTextAreaElement) || !box.closest("#conversation .composer")) return;
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      if (box.value.trim() && !box.disabled) box.form.requestSubmit();
    }
  });

  document.addEventListener("click", (event) => {
    const stop = event.target.closest?.("#conversation [data-action=stop]");
    if (stop) activeTurn()?.querySelector("[data-action=cancel]")?.click();
  });

  document.addEventListener("htmx:beforeRequest", (event) => {
    const form = event.detail.elt;
    if (form.matches?.("#conversation .composer")) document.getElementById("composer-notice")?.replaceChildren();
  });

  document.addEventListener("htmx:afterRequest", (event) => {
    const elt = event.detail.elt;
    if (elt.matches?.("#conversation .composer") && event.detail.successful && event.detail.xhr.status === 200) {
      elt.querySelector("textarea").value = "";
    }
    if (elt.matches?.("[data-action=cancel]")) {
      const turn = elt.closest(".turn") || document.querySelector(`.turn[data-run-id="${sel(elt.closest("[data-run-id]")?.dataset.runId)}"]`);
      if (turn) { setTimeout(() => checkTurn(turn), 1500); setTimeout(() => checkTurn(turn), 5000); }
    }
  });

  document.addEventListener("htmx:beforeSwap", (event) => {
    // Switching conversations: stop following the old column's runs.
    if (event.detail.target?.id === "conversation-column") {
      for (const entry of sockets.values()) entry.stop();
      sockets.clear();
    }
  });

  document.addEventListener("htmx:afterSwap", (event) => {
    if (event.detail.target?.id === "conversation-column" || event.detail.target?.id === "timeline") {
      const box = timeline();
      if (box && (event.detail.target.id === "conversation-column" || event.detail.requestConfig?.elt?.matches?.(".composer, .approval-form"))) {
        box.scrollTop = box.scrollHeight;
      }
    }
  });

  // htmx:load is listened to directly: htmx.onLoad() registered from a DOMContentLoaded handler can miss
  // htmx's own readiness and never fire.
  document.addEventListener("htmx:load", (event) => init(event.detail.elt));

  function start() {
    init(document);
    const box = timeline();
    if (box) box.scrollTop = box.scrollHeight;
  }

  window.adeConversation = { follow, finish, sockets };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
