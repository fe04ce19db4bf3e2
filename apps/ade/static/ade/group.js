// The group page (views/groups.py): streams each live turn. A turn's partial names the run of its current
// speaker (data-run-id, data-speaker); the page follows that run over the run WebSocket relay
// (ws/runs/<id>/?after=<cursor>, as conversation.js does), rendering its events as they arrive under the
// speaker's name. When the run ends it takes the turn's partial again (the server's rendering of all that
// was said so far) and follows the next speaker's run it names, until the turn is over. The socket's
// ping (every 15 s of silence) makes it check the partial too: a run cancelled before it started never
// writes an end event. The markup mirrors ade/groups/_speaker_event.html.
(() => {
  if (window.adeGroup) return;
  const followed = new Map(); // turn id -> {runId, socket (adeRunStream.follow)}

  const { el, sel, renderShared } = window.adeRunStream; // ade/runstream.js
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
  function render(body, event) {
    if (renderShared(body, event)) return;
    if (event.message_type === "tool_return_message") {
      body.append(el("details", { class: "ev ev-tool-return", "data-call-id": event.tool_call_id },
        el("summary", {}, el("span", { class: "ev-label" }, "Tool return"), " ", el("code", { class: "tool-name" }, event.name || "")),
        el("pre", { class: "json" }, event.tool_return || "")));
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
    entry.socket?.stop();
  }

  function follow(turn) {
    const turnId = turn.dataset.turnId;
    if (!turn.dataset.live) { stop(turnId); return; }
    const runId = turn.dataset.runId;
    if (!runId) { moveOn(turnId, ""); return; } // no speaker yet: wait for the first
    const current = followed.get(turnId);
    if (current && current.runId === runId) return;
    stop(turnId);
    const entry = { runId, socket: null };
    followed.set(turnId, entry);
    const mine = () => followed.get(turnId) === entry;
    entry.socket = window.adeRunStream.follow(runId, "0-0", {
      onPing: () => { if (mine()) moveOn(turnId, runId, 1); },
      onEvent: (event) => {
        if (!mine()) return;
        emit("ade:group-run-event", { turn_id: turnId, run_id: runId, event });
        if (event.message_type === "run_end") { moveOn(turnId, runId); return; }
        const turn = turnEl(turnId);
        const body = turn && speakerBody(turn, runId);
        if (body) render(body, event);
      },
      onRetry: (retries) => { if (mine() && retries >= 3) moveOn(turnId, runId, 1); },
      onRefused: () => { if (mine()) stop(turnId); },
    });
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
