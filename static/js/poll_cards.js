// A card of work the web worker has not finished (a preview being planned, a generation, a download being
// packed): every second, fetch the URL in its data-poll and put the card of the same id from the answer in place
// of this one, until the fresh card has no data-poll (done or failed). Only that card changes, so the rest of the
// page, and what was typed in its forms, stays as it is. A 404 means the card's object was deleted meanwhile.
(function () {
  "use strict";
  function poll(card) {
    setTimeout(function () {
      fetch(card.dataset.poll, {credentials: "same-origin"})
        .then(function (response) {
          if (response.status === 404) return null;
          return response.ok ? response.text() : "";
        })
        .then(function (html) {
          if (html === null) return;
          const fresh = html && new DOMParser().parseFromString(html, "text/html").getElementById(card.id);
          if (!fresh) return poll(card);  // an error page, or no such card in it: ask again
          card.replaceWith(fresh);
          if (fresh.dataset.poll) poll(fresh);
        })
        .catch(function () { poll(card); });
    }, 1000);
  }
  document.querySelectorAll(".card[data-poll][id]").forEach(poll);
})();
