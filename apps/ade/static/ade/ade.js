// Small page-wide behaviour. Panel-specific scripts live next to it (conversation.js, ...).
document.addEventListener("htmx:afterSwap", () => {
  // Flash messages fade after a while so they never cover the page for long.
  document.querySelectorAll("#flash .msg:not([data-timed])").forEach((el) => {
    el.dataset.timed = "1";
    setTimeout(() => el.remove(), 8000);
  });
});
