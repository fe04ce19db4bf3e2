// The workspace's memory column: live character counts, in-place block editing, and live refresh of the
// blocks and the context window viewer when the agent edits memory during a turn.
//
// Listens to the workspace's shared events (dispatched on document.body by the other columns):
//   ade:run-event  {run_id, event}   a tool return may have edited memory: refresh (debounced)
//   ade:run-end    {run_id, ...}     refresh
//   ade:agent-changed                a panel action changed the agent (a block save sends it too)
// A block the user is editing is never overwritten: it is marked as changed elsewhere instead, and its save
// is checked against the version it started from (the server answers 409 with the current value).
(() => {
  "use strict";
  if (window.adeMemory) return; // the column partial may be rendered more than once
  const HIGHLIGHT_MS = 4000;
  const TOOL_RETURN_DEBOUNCE_MS = 300;
  let timer = null;
  let inflight = null;

  const column = () => document.querySelector(".memory-column");

  function updateCount(block) {
    const textarea = block.querySelector("textarea.mem-value");
    if (!textarea) return;
    const length = textarea.value.length;
    const limit = Number(block.dataset.limit);
    const count = block.querySelector("[data-count]");
    if (count) count.textContent = String(length);
    const holder = block.querySelector(".mem-count");
    if (holder) {
      holder.classList.toggle("over", length > limit);
      holder.title = length > limit ? `${length - limit} characters over the limit of ${limit}` : "Characters used / limit";
    }
    block.classList.toggle("dirty", textarea.value !== textarea.dataset.original);
  }

  function isEditing(block) {
    return block.classList.contains("dirty");
  }

  function highlight(block) {
    block.classList.remove("mem-changed");
    void block.offsetWidth; // restart the animation
    block.classList.add("mem-changed");
    setTimeout(() => block.classList.remove("mem-changed"), HIGHLIGHT_MS);
  }

  // Put fresh server-rendered blocks in place: unchanged ones stay as they are (focus, scroll, open
  // history), changed ones are replaced and highlighted, the one being edited is only flagged.
  function mergeBlocks(html) {
    const current = document.getElementById("memory-blocks");
    const fresh = new DOMParser().parseFromString(html, "text/html").getElementById("memory-blocks");
    if (!current || !fresh) return;
    const seen = new Set();
    for (const next of Array.from(fresh.querySelectorAll(":scope > .mem-block"))) {
      seen.add(next.id);
      const old = document.getElementById(next.id);
      if (!old) {
        document.getElementById("memory-blocks-empty")?.remove();
        current.appendChild(next);
        htmx.process(next);
        highlight(next);
      } else if (old.dataset.version !== next.dataset.version) {
        if (isEditing(old)) {
          markStale(old, next.dataset.version);
        } else {
          const history = old.querySelector(".mem-history");
          const historyOpen = history && history.childElementCount > 0;
          const focused = old.contains(document.activeElement);
          old.replaceWith(next);
          htmx.process(next);
          highlight(next);
          if (historyOpen) next.querySelector(".mem-history-toggle")?.click();
          if (focused) next.querySelector("textarea.mem-value")?.focus();
        }
      }
    }
    for (const old of Array.from(current.querySelectorAll(":scope > .mem-block"))) {
      if (!seen.has(old.id) && !isEditing(old)) old.remove();
    }
  }

  function markStale(block, version) {
    let note = block.querySelector(".mem-stale");
    if (!note) {
      note = document.createElement("p");
      note.className = "mem-stale small";
      note.setAttribute("role", "status");
      block.querySelector(".mem-form")?.before(note);
    }
    note.textContent = `Changed meanwhile (now version ${version}). Saving will show you the new value instead of overwriting it.`;
  }

  async function refresh() {
    const root = column();
    if (!root) return;
    if (inflight) inflight.abort();
    const controller = new AbortController();
    inflight = controller;
    try {
      const response = await fetch(root.dataset.blocksUrl, {
        headers: { "HX-Request": "true" },
        signal: controller.signal,
        credentials: "same-origin",
      });
      if (response.ok) mergeBlocks(await response.text());
    } catch (error) {
      if (error.name !== "AbortError") console.warn("memory: refresh failed", error);
    } finally {
      if (inflight === controller) inflight = null;
    }
    const context = document.getElementById("memory-context");
    if (context) htmx.trigger(context, "memory:refresh");
  }

  function schedule(delay) {
    clearTimeout(timer);
    timer = setTimeout(refresh, delay);
  }

  document.body.addEventListener("ade:run-event", (event) => {
    const message = event.detail && event.detail.event;
    if (message && message.message_type === "tool_return_message") schedule(TOOL_RETURN_DEBOUNCE_MS);
  });
  document.body.addEventListener("ade:run-end", () => schedule(50));
  document.body.addEventListener("ade:agent-changed", () => schedule(50));

  document.addEventListener("input", (event) => {
    const block = event.target.closest && event.target.closest(".mem-block");
    if (block && event.target.matches("textarea.mem-value")) updateCount(block);
  });

  document.addEventListener("keydown", (event) => {
    if (!event.target.matches || !event.target.matches("textarea.mem-value")) return;
    const block = event.target.closest(".mem-block");
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
      event.preventDefault();
      event.target.form.requestSubmit();
    } else if (event.key === "Escape" && block.classList.contains("dirty")) {
      cancel(block);
    }
  });

  function cancel(block) {
    const textarea = block.querySelector("textarea.mem-value");
    textarea.value = textarea.dataset.original;
    block.querySelector(".mem-stale")?.remove();
    block.querySelector(".field-error")?.remove();
    updateCount(block);
    // A block left stale while edited catches up now.
    schedule(0);
  }

  document.addEventListener("click", (event) => {
    const target = event.target;
    if (!target.closest) return;
    const block = target.closest(".mem-block");
    if (target.closest("[data-mem-cancel]") && block) {
      cancel(block);
    } else if (target.closest("[data-mem-use-draft]") && block) {
      const textarea = block.querySelector("textarea.mem-value");
      textarea.value = block.querySelector("textarea.mem-draft").value;
      updateCount(block);
      textarea.focus();
    } else if (target.closest("[data-mem-close-history]") && block) {
      block.querySelector(".mem-history").replaceChildren();
    }
  });

  // "History" toggles: a second click closes the open panel instead of loading it again.
  document.body.addEventListener("htmx:beforeRequest", (event) => {
    const trigger = event.detail.elt;
    if (!trigger.classList || !trigger.classList.contains("mem-history-toggle")) return;
    const panel = trigger.closest(".mem-block")?.querySelector(".mem-history");
    if (panel && panel.childElementCount > 0) {
      event.preventDefault();
      panel.replaceChildren();
    }
  });

  // The conversation the centre column shows: its in-context messages are what the next request holds.
  function conversationId() {
    const conversation = document.getElementById("conversation");
    return (conversation && conversation.dataset.conversationId) || "";
  }

  // Switching conversations re-renders the centre column: the context window changes with it.
  document.body.addEventListener("htmx:afterSwap", (event) => {
    if (event.detail.target && event.detail.target.id === "conversation-column") schedule(0);
  });

  window.adeMemory = { refresh, conversationId };
})();
