// Talon: keyboard stepping (← → Home End) for the step slider, for teaching on a projector.
(() => {
  const ids = { ArrowLeft: "talon-prev", ArrowRight: "talon-next", End: "talon-latest" };
  const typing = (el) => el && (el.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(el.tagName));
  document.addEventListener("keydown", (event) => {
    if (event.altKey || event.ctrlKey || event.metaKey || typing(document.activeElement)) return;
    const id = ids[event.key];
    if (!id) return;
    const el = document.getElementById(id);
    const button = el && (el.tagName === "BUTTON" ? el : el.querySelector("button"));
    if (button) {
      event.preventDefault();
      button.click();
    }
  });
})();
