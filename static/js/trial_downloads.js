// A download the web worker is packing: fetch the trial's page every second and put its fresh download card in
// place of this one, so that the progress moves and the link comes without reloading the page (and without
// losing what was typed in its other forms).
(function () {
  "use strict";
  function poll(card) {
    setTimeout(function () {
      fetch(card.dataset.poll, {credentials: "same-origin"})
        .then(function (response) { return response.ok ? response.text() : null; })
        .then(function (html) {
          if (html === null) return;  // deleted with its trial meanwhile
          const fresh = new DOMParser().parseFromString(html, "text/html").getElementById(card.id);
          if (!fresh) return poll(card);
          card.replaceWith(fresh);
          if (fresh.dataset.poll) poll(fresh);
        })
        .catch(function () { poll(card); });
    }, 1000);
  }
  const card = document.querySelector("#downloads[data-poll]");
  if (card) poll(card);
})();
