// The tool editor: Ace on top of the source textarea (which stays the form field and the trigger of
// the live schema preview), and the test-run arguments prefilled from the schema until edited.
(() => {
  function startAce(host) {
    const textarea = document.getElementById(host.dataset.aceFor);
    if (!textarea || host.dataset.ready || !window.ace) return;  // without Ace the textarea is the editor
    ace.config.set("basePath", host.dataset.aceBase);
    const editor = ace.edit(host, {
      mode: "ace/mode/python",
      theme: "ace/theme/github",
      tabSize: 4,
      useSoftTabs: true,
      fontSize: 13,
      showPrintMargin: false,
      minLines: 22,
      maxLines: 60,
      wrap: false,
    });
    editor.session.setValue(textarea.value);
    host.hidden = false;
    host.dataset.ready = "1";
    textarea.classList.add("ace-backed");
    textarea.tabIndex = -1;
    // Every change goes into the textarea, and a keyup there starts the (debounced) schema preview.
    editor.session.on("change", () => {
      textarea.value = editor.getValue();
      textarea.dispatchEvent(new KeyboardEvent("keyup", { bubbles: true }));
    });
    editor.commands.addCommand({
      name: "save",
      bindKey: { win: "Ctrl-S", mac: "Command-S" },
      exec: () => textarea.form.requestSubmit(),
    });
    host.aceEditor = editor;
  }

  function prefillArgs(root) {
    const sample = root.querySelector("[data-sample-args]");
    const args = document.getElementById("run-args");
    if (sample && args && !args.dataset.touched) args.value = sample.dataset.sampleArgs;
  }

  document.addEventListener("input", (event) => {
    if (event.target.id === "run-args") event.target.dataset.touched = "1";
  });
  document.addEventListener("htmx:afterSwap", (event) => {
    if (event.target.id === "schema-preview") prefillArgs(event.target);
  });
  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("[data-ace-for]").forEach(startAce);
  });
})();
