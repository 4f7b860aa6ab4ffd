// hpctrain web console, the dev sessions page: copy buttons, and the page kept current while a session starts.
// Text is only ever read from and set as textContent.
"use strict";

function copyNext(button) {
  const code = button.parentElement.querySelector("code");
  const text = code ? code.textContent : "";
  const said = (word) => {
    button.textContent = word;
    setTimeout(() => (button.textContent = "copy"), 1500);
  };
  if (navigator.clipboard && window.isSecureContext) {
    navigator.clipboard.writeText(text).then(() => said("copied"), () => said("select it"));
  } else {
    const range = document.createRange(); // no clipboard API (a plain-http origin): select it for Ctrl-C
    range.selectNodeContents(code);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
    said(document.execCommand && document.execCommand("copy") ? "copied" : "selected");
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("button.copy").forEach((button) => button.addEventListener("click", () => copyNext(button)));
  const box = document.getElementById("sessions");
  if (box && box.dataset.starting) {
    // a start is under way: show its steps as they come (a reload changes nothing: GET only reads)
    setTimeout(() => window.location.reload(), Math.max(1, parseFloat(box.dataset.interval) || 5) * 1000);
  }
});
