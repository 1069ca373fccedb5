// A generation the web worker has not finished yet: fetch its page until it is done or failed and put its card
// in place of this one, so that the prompt box (and what was typed in it) stays as it is.
(function () {
  "use strict";
  function poll(card) {
    setTimeout(function () {
      fetch(card.dataset.poll, {credentials: "same-origin"})
        .then(function (response) { return response.status === 404 ? null : response.text(); })
        .then(function (html) {
          if (html === null) return;  // deleted with its trial meanwhile
          const fresh = new DOMParser().parseFromString(html, "text/html").getElementById(card.id);
          if (!fresh) return poll(card);
          card.replaceWith(fresh);
          if (fresh.dataset.poll) poll(fresh);
        })
        .catch(function () { poll(card); });
    }, 1500);
  }
  document.querySelectorAll(".generation[data-poll]").forEach(poll);
})();
