// Refuse a file over the upload limit before sending it: the browser shows the message at the field.
// The server holds the same limit while the upload streams in (webapp/datasets/uploads.py).
"use strict";
document.querySelectorAll("input[type=file][data-max-bytes]").forEach((input) => {
  input.addEventListener("change", () => {
    const limit = Number(input.dataset.maxBytes);
    const file = input.files[0];
    input.setCustomValidity(file && file.size > limit
      ? `The file is ${(file.size / 1048576).toFixed(1)} MB; the limit is ${(limit / 1048576).toFixed(1)} MB.`
      : "");
    input.reportValidity();
  });
});
