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

// The guided walk: light up the figure the walk's card points at (data-focus), scroll it into
// view once per stop, and clear the light when the walk ends.
(() => {
  let shown = "";
  const update = () => {
    const card = document.querySelector("#talon-walk .talon-walk-card[data-focus]");
    const visible = card && card.offsetParent !== null;
    const key = visible ? `${card.dataset.focus}/${card.dataset.stop}` : "";
    if (key === shown) return;
    shown = key;
    document.querySelectorAll(".talon-focus").forEach((el) => el.classList.remove("talon-focus"));
    if (!visible) return;
    const target = document.getElementById(card.dataset.focus);
    if (target) {
      target.classList.add("talon-focus");
      target.scrollIntoView({ behavior: "smooth", block: "center" });
    }
  };
  new MutationObserver(update).observe(document.documentElement, { childList: true, subtree: true, attributes: true, attributeFilter: ["style", "class", "data-stop"] });
})();
