// The experiment form: add search-space rows, and show only the fields the current choices use.
// Plain JS, no dependencies; the form works without it (every field stays visible).
(function () {
  "use strict";
  const form = document.getElementById("experiment-form");
  if (!form) return;

  const body = document.querySelector("#space-rows tbody");
  const template = document.getElementById("space-row-template");
  const total = form.querySelector("input[name='space-TOTAL_FORMS']");

  function updateRow(row) {
    const kind = row.querySelector("select[name$='-kind']");
    if (!kind) return;
    const categorical = kind.value === "categorical";
    row.querySelector("input[name$='-values']").disabled = !categorical;
    ["low", "high"].forEach(function (field) {
      row.querySelector("input[name$='-" + field + "']").disabled = categorical;
    });
    row.querySelector("input[name$='-step']").disabled = kind.value !== "int";
    const remove = row.querySelector("input[name$='-DELETE']");
    row.classList.toggle("removed", remove && remove.checked);
  }

  document.getElementById("add-space-row").addEventListener("click", function () {
    const index = parseInt(total.value, 10);
    const html = template.innerHTML.replace(/__prefix__/g, String(index));
    body.insertAdjacentHTML("beforeend", html);
    total.value = String(index + 1);
    updateRow(body.lastElementChild);
  });

  body.addEventListener("change", function (event) {
    const row = event.target.closest("tr");
    if (row) updateRow(row);
  });
  body.querySelectorAll("tr").forEach(updateRow);

  // Pasted text replaces the rows: set them aside (and say so above them) while the text box holds any.
  const pasted = document.getElementById("id_space_text");
  const rowsTable = document.getElementById("space-rows");
  function updateRowsSetAside() {
    const aside = pasted.value.trim() !== "";
    document.getElementById("rows-set-aside").hidden = !aside;
    rowsTable.classList.toggle("set-aside", aside);
    rowsTable.inert = aside;
    document.getElementById("add-space-row").disabled = aside;
  }
  pasted.addEventListener("input", updateRowsSetAside);
  updateRowsSetAside();

  // data-show-when="field=value1,value2": show the block only while `field` has one of those values.
  function choice(name) {
    const checked = form.querySelector("input[name='" + name + "']:checked");
    if (checked) return checked.value;
    const select = form.querySelector("select[name='" + name + "']");
    return select ? select.value : "";
  }
  function updateVisibility() {
    form.querySelectorAll("[data-show-when]").forEach(function (block) {
      const parts = block.dataset.showWhen.split("=");
      block.hidden = parts[1].split(",").indexOf(choice(parts[0])) < 0;
    });
  }
  form.addEventListener("change", updateVisibility);
  updateVisibility();

  // A chat template is checked by the web worker: ask how its check stands until it has a verdict, and say it.
  function pollCheck(line) {
    setTimeout(function () {
      fetch(line.dataset.poll, {credentials: "same-origin"})
        .then(function (response) { return response.ok ? response.json() : null; })
        .then(function (check) {
          if (check === null) return;
          if (check.status === "checking") return pollCheck(line);
          line.dataset.status = check.status;
          line.className = check.status === "ok" ? "ok" : "errors";
          line.textContent = check.message;
        })
        .catch(function () { pollCheck(line); });
    }, 1500);
  }
  const checking = document.querySelector("#chat-template-check[data-poll]");
  if (checking) pollCheck(checking);

  // After "Preview trials" the answer is the preview, below the long form: bring it into view; after a refusal,
  // the first error.
  const answer = document.getElementById("preview") || form.querySelector(".errorlist, .errors");
  if (answer) answer.scrollIntoView({block: "start"});
})();
