// Render the formulas pymdownx.arithmatex wraps (generic mode) with the vendored KaTeX, on every page load,
// including Material's instant navigation (document$).
function renderMath() {
  renderMathInElement(document.body, {
    delimiters: [
      { left: "\\[", right: "\\]", display: true },
      { left: "\\(", right: "\\)", display: false },
    ],
    throwOnError: false,
  });
}
if (typeof document$ !== "undefined") {
  document$.subscribe(renderMath);
} else {
  document.addEventListener("DOMContentLoaded", renderMath);
}
