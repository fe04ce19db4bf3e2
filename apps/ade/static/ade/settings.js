// Settings pages: copy a just-created API key, and the provider form's type-dependent hints.
(() => {
  document.addEventListener("click", async (event) => {
    const button = event.target.closest("[data-copy]");
    if (!button) return;
    const source = document.querySelector(button.dataset.copy);
    if (!source) return;
    const text = source.textContent.trim();
    try {
      await navigator.clipboard.writeText(text);
    } catch {
      // No clipboard API (plain http, old browser): select the text so Ctrl+C copies it.
      const range = document.createRange();
      range.selectNodeContents(source);
      const selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      button.textContent = "Press Ctrl+C";
      return;
    }
    button.textContent = "Copied ✓";
    setTimeout(() => { button.textContent = "Copy"; }, 2000);
  });

  // The provider form: a type's natural name, its base-URL placeholder and what it needs.
  const defaultNames = new Set();
  function syncProviderForm(form, typeChanged) {
    const select = form.querySelector("[data-provider-type]");
    if (!select) return;
    const option = select.selectedOptions[0];
    const name = form.querySelector("[data-provider-name]");
    const url = form.querySelector("[data-provider-url]");
    const needs = form.querySelector("[data-provider-needs]");
    select.querySelectorAll("option").forEach((o) => defaultNames.add(o.dataset.name));
    if (typeChanged && name && (!name.value || defaultNames.has(name.value))) name.value = option.dataset.name;
    if (url) url.placeholder = option.dataset.url;
    if (needs) needs.textContent = option.dataset.needs;
  }
  function init(root) {
    root.querySelectorAll(".provider-form").forEach((form) => syncProviderForm(form, false));
  }
  document.addEventListener("change", (event) => {
    if (event.target.matches("[data-provider-type]")) syncProviderForm(event.target.form, true);
  });
  document.addEventListener("DOMContentLoaded", () => init(document));
  document.addEventListener("htmx:afterSettle", (event) => init(event.target));
})();
