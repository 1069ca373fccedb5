// The experiment page keeps itself current without a reload: while a trial is active (or the tokens its trials
// wait for are being made), it fetches itself again every few seconds and puts the fresh copy of each part
// marked data-live (the status word, the controls, the token ids, the trials' rows) in place of the old one.
// A part holding the focus is left for the next time. Once nothing moves, a few more fetches pick up what the
// telemetry ingest stores last (the final evaluations), then it stops.
(function () {
  "use strict";
  const POLL_MS = 3000;
  const SETTLING_POLLS = 3;

  function running(doc) {
    const state = doc.getElementById("experiment-state");
    return state !== null && state.dataset.running === "true";
  }

  let settling = running(document) ? SETTLING_POLLS : 0;
  if (!settling) return;

  function refresh(fresh) {
    document.querySelectorAll("[data-live][id]").forEach(function (part) {
      const replacement = fresh.getElementById(part.id);
      if (replacement && !part.contains(document.activeElement)) part.replaceWith(replacement);
    });
  }

  function poll() {
    fetch(window.location.href, {credentials: "same-origin", headers: {Accept: "text/html"}})
      .then(function (response) {
        if (!response.ok) throw new Error("the page answered " + response.status);
        return response.text();
      })
      .then(function (html) {
        const fresh = new DOMParser().parseFromString(html, "text/html");
        if (!fresh.getElementById("experiment-state")) throw new Error("not the experiment page (logged out?)");
        refresh(fresh);
        settling = running(fresh) ? SETTLING_POLLS : settling - 1;
        if (settling > 0) window.setTimeout(poll, POLL_MS);
      })
      .catch(function (error) {
        // A server restart or a dropped connection: keep the page and try again on the next tick.
        console.warn("experiment refresh failed, retrying:", error.message);
        window.setTimeout(poll, POLL_MS);
      });
  }

  window.setTimeout(poll, POLL_MS);
})();
