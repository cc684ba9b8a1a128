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

// Predict, then check (talon.figures.predict): pressing an answer reveals the verdict, marks the
// pressed button right or wrong, and lifts the veil over the figures that gave the answer away.
document.addEventListener("click", (event) => {
  const button = event.target.closest && event.target.closest(".talon-choice");
  const box = button && button.closest(".talon-predict");
  if (!box) return;
  box.querySelectorAll(".talon-choice").forEach((b) => {
    b.classList.toggle("talon-is-right", b.dataset.right === "1");
    b.classList.remove("talon-picked");
  });
  button.classList.add("talon-picked");
  box.classList.add("talon-answered");
  box.classList.toggle("talon-got-it", button.dataset.right === "1");
  box.querySelector(".talon-answer").hidden = false;
});
