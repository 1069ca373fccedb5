// The dataset form. Choosing a file selects "Uploaded file", and typing a path in the import folder selects
// the import, so that the data the user gave is the data used (the server refuses data the Data choice
// would not use, for a browser without this script). A file over the upload limit is refused before it is
// sent: the browser shows the message at the field, and the server holds the same limit while the upload
// streams in (webapp/datasets/uploads.py).
"use strict";
function chooseSource(form, value) {
  const radio = form.querySelector(`input[name=source][value=${value}]`);
  if (radio) radio.checked = true;
}
document.querySelectorAll("input[type=file][data-max-bytes]").forEach((input) => {
  input.addEventListener("change", () => {
    const limit = Number(input.dataset.maxBytes);
    const file = input.files[0];
    if (file && input.form) chooseSource(input.form, "upload");
    input.setCustomValidity(file && file.size > limit
      ? `The file is ${(file.size / 1048576).toFixed(1)} MB; the limit is ${(limit / 1048576).toFixed(1)} MB.`
      : "");
    input.reportValidity();
  });
});
document.querySelectorAll("input[name=server_path]").forEach((input) => {
  input.addEventListener("input", () => {
    if (input.value.trim() && input.form) chooseSource(input.form, "import");
  });
});
