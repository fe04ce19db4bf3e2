// The folder page's uploads: files dropped on the zone or picked go up one request each (XMLHttpRequest,
// for its upload progress events) to the ADE's upload view, each with its own progress bar and the server's
// answer: "uploaded", or the service's refusal (too large, over the quota, an unsupported type, not
// allowed). A file over the size limit is not sent at all: the server is asked for its refusal by size.
// After each upload the files table (#folder-files) reloads, and polls itself while files are ingested.
(() => {
  "use strict";

  function csrfToken(form) {
    const input = form.querySelector("input[name=csrfmiddlewaretoken]");
    return input ? input.value : "";
  }

  function refreshFiles() {
    document.body.dispatchEvent(new CustomEvent("folder-files:refresh"));
  }

  // The text of the answer's outcome: the refusal's message, or what became of the upload.
  function outcomeOf(xhr) {
    const doc = new DOMParser().parseFromString(xhr.responseText || "", "text/html");
    const node = doc.querySelector("[data-outcome]");
    return node ? { kind: node.dataset.outcome, text: node.textContent.trim() } : null;
  }

  function addItem(list, file) {
    const item = document.createElement("li");
    item.className = "upload-item";
    item.setAttribute("data-testid", "upload-item");
    item.dataset.fileName = file.name;
    item.dataset.state = "queued";
    const head = document.createElement("div");
    head.className = "upload-head";
    const name = document.createElement("code");
    name.className = "upload-name";
    name.textContent = file.name;
    const status = document.createElement("span");
    status.className = "upload-status muted small";
    status.setAttribute("data-testid", "upload-status");
    status.textContent = "waiting";
    head.append(name, status);
    const bar = document.createElement("progress");
    bar.max = 100;
    bar.value = 0;
    bar.setAttribute("aria-label", `Upload of ${file.name}`);
    bar.setAttribute("data-testid", "upload-progress");
    const message = document.createElement("div");
    message.className = "upload-message small";
    message.setAttribute("data-testid", "upload-message");
    item.append(head, bar, message);
    list.prepend(item);
    return {
      item,
      set(state, text, note = "") {
        item.dataset.state = state;
        status.textContent = text;
        message.textContent = note;
        message.setAttribute("role", state === "error" ? "alert" : "status");
        message.classList.toggle("field-error", state === "error");
      },
      progress(percent) {
        bar.value = percent;
      },
    };
  }

  function request(form, url, body, ui) {
    const xhr = new XMLHttpRequest();
    xhr.open("POST", url);
    xhr.setRequestHeader("X-CSRFToken", csrfToken(form));
    xhr.setRequestHeader("X-Requested-With", "XMLHttpRequest");
    return new Promise((resolve) => {
      if (ui) {
        xhr.upload.addEventListener("progress", (event) => {
          if (event.lengthComputable) ui.progress(Math.round((100 * event.loaded) / event.total));
        });
      }
      xhr.addEventListener("load", () => resolve(xhr));
      xhr.addEventListener("error", () => resolve(null));
      xhr.addEventListener("abort", () => resolve(null));
      xhr.send(body);
    });
  }

  function refused(ui, xhr) {
    const outcome = outcomeOf(xhr);
    const text = outcome && outcome.kind === "refused" ? outcome.text : `The server answered ${xhr.status}.`;
    ui.set("error", "refused", text);
  }

  async function upload(form, file) {
    const list = form.querySelector(".upload-list");
    const ui = addItem(list, file);
    const url = form.dataset.uploadUrl;
    if (file.size > Number(form.dataset.maxBytes)) {
      // Ask first: the refusal comes without sending the file.
      ui.set("checking", "checking size");
      const params = new URLSearchParams({ size: String(file.size), name: file.name });
      const check = await request(form, `${url}?${params}`, null, null);
      if (!check) return ui.set("error", "failed", "The upload could not reach the server.");
      if (check.status !== 204) return refused(ui, check);
    }
    ui.set("uploading", "uploading");
    const body = new FormData();
    body.append("file", file, file.name);
    const xhr = await request(form, url, body, ui);
    if (!xhr) return ui.set("error", "failed", "The upload could not reach the server.");
    if (xhr.status >= 200 && xhr.status < 300) {
      ui.progress(100);
      const outcome = outcomeOf(xhr);
      ui.set("done", "done", outcome ? outcome.text : "Uploaded.");
      refreshFiles();
    } else {
      refused(ui, xhr);
    }
  }

  function uploadAll(form, files) {
    for (const file of Array.from(files)) upload(form, file);
  }

  function start(form) {
    if (form.dataset.ready) return;
    form.dataset.ready = "1";
    const zone = form.querySelector(".drop-zone");
    const input = form.querySelector("input[type=file]");
    input.addEventListener("change", () => {
      uploadAll(form, input.files);
      input.value = "";
    });
    zone.addEventListener("click", (event) => {
      if (!event.target.closest("label, input")) input.click();
    });
    zone.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        input.click();
      }
    });
    for (const type of ["dragenter", "dragover"]) {
      zone.addEventListener(type, (event) => {
        event.preventDefault();
        zone.classList.add("dragging");
      });
    }
    zone.addEventListener("dragleave", (event) => {
      if (!zone.contains(event.relatedTarget)) zone.classList.remove("dragging");
    });
    zone.addEventListener("drop", (event) => {
      event.preventDefault();
      zone.classList.remove("dragging");
      if (event.dataTransfer && event.dataTransfer.files.length) uploadAll(form, event.dataTransfer.files);
    });
    // The plain form's submit is for browsers without this script.
    form.addEventListener("submit", (event) => event.preventDefault());
  }

  // A file dropped next to the zone must not make the browser navigate away to it.
  window.addEventListener("dragover", (event) => event.preventDefault());
  window.addEventListener("drop", (event) => event.preventDefault());

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("form.upload-form").forEach(start);
  });
})();
