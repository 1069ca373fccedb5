// Hydra dashboards: draw the figures the server built (json_script), then, while anything runs, poll the
// page's JSON endpoint with its cursor and append only the new points. Polling stops when the experiment ends.
(function () {
  "use strict";

  const CONFIG = { responsive: true, displaylogo: false };
  const plots = {};

  function json(id) {
    const node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }

  document.querySelectorAll("[data-figure]").forEach(function (el) {
    const figure = json(el.dataset.figure);
    if (figure) {
      Plotly.newPlot(el, figure.data, figure.layout, CONFIG);
      plots[el.dataset.figure] = el;
    }
  });

  const state = json("dashboard-state");
  if (!state) {
    return;
  }

  // Trace indices by (key, role), from the `meta` each server-built trace carries.
  function traceIndex(el, key, value, role) {
    return el.data.findIndex(function (t) { return t.meta && t.meta[key] === value && t.meta.role === role; });
  }

  function updateTrials(trials) {
    Object.keys(trials).forEach(function (id) {
      const row = document.querySelector('#trial-table tr[data-trial="' + id + '"]');
      if (!row) {
        return;
      }
      const t = trials[id];
      row.querySelector('[data-field="status"]').textContent = t.status;
      row.querySelector('[data-field="step"]').textContent = t.step + " / " + t.total_steps;
      row.querySelector('[data-field="best_val_loss"]').textContent = t.best_val_loss === null ? "–" : t.best_val_loss.toFixed(4);
      row.querySelector('[data-field="best_val_ppl"]').textContent = t.best_val_ppl === null ? "–" : t.best_val_ppl.toFixed(2);
    });
  }

  // The same recurrence as figures.ema, continued from the smoothed trace's last value.
  function ema(values, weight, previous) {
    let s = previous;
    return values.map(function (v) {
      s = s === undefined ? v : weight * s + (1 - weight) * v;
      return s;
    });
  }

  function applyCurves(data) {
    const el = plots["curves-figure"];
    let unknown = false;
    Object.keys(data.points).forEach(function (key) {
      const trial = Number(key);
      const p = data.points[key];
      const raw = traceIndex(el, "trial", trial, "raw");
      const smooth = traceIndex(el, "trial", trial, "smooth");
      const evals = traceIndex(el, "trial", trial, "eval");
      if (raw < 0 || smooth < 0 || evals < 0) {
        unknown = true;
        return;
      }
      if (p.x.length) {
        const ys = el.data[smooth].y;
        const last = ys.length ? ys[ys.length - 1] : undefined;
        Plotly.extendTraces(el, { x: [p.x, p.x], y: [p.y, ema(p.y, state.smoothing, last)] }, [raw, smooth]);
      }
      if (p.eval_x.length) {
        Plotly.extendTraces(el, { x: [p.eval_x], y: [p.eval_y] }, [evals]);
      }
    });
    return unknown;
  }

  // A DPO trial's rewards, on its own figure (the trial page's and the curves page's share the element's id).
  function applyRewards(rewards) {
    const el = document.getElementById("rewards-plot");
    let unknown = false;
    Object.keys(rewards || {}).forEach(function (key) {
      const trial = Number(key);
      const r = rewards[key];
      const roles = ["chosen", "rejected", "accuracy", "eval_accuracy"];
      const at = el && el.data ? roles.map(function (role) { return traceIndex(el, "trial", trial, role); }) : [-1];
      if (at.some(function (i) { return i < 0; })) {
        unknown = true;  // no figure yet (the page was drawn before the first rewards), or not this trial's traces
        return;
      }
      if (r.x.length) {
        Plotly.extendTraces(el, { x: [r.x, r.x, r.x], y: [r.chosen, r.rejected, r.accuracy] }, at.slice(0, 3));
      }
      if (r.eval_x.length) {
        Plotly.extendTraces(el, { x: [r.eval_x], y: [r.eval_accuracy], customdata: [r.eval_margin] }, [at[3]]);
      }
    });
    return unknown;
  }

  function applyDevices(data) {
    const timeline = plots["timeline-figure"];
    let unknown = false;
    Object.keys(data.spans).forEach(function (key) {
      const i = traceIndex(timeline, "trial", Number(key), "units");
      const s = data.spans[key];
      if (i < 0) {
        unknown = true;
        return;
      }
      Plotly.extendTraces(timeline, { base: [s.base], x: [s.x], y: [s.y], customdata: [s.customdata] }, [i],
        state.span_limit);
    });
    Object.keys(data.samples).forEach(function (lane) {
      const s = data.samples[lane];
      const u = traceIndex(plots["utilization-figure"], "lane", lane, "utilization");
      const m = traceIndex(plots["memory-figure"], "lane", lane, "memory");
      if (u < 0 || m < 0) {
        unknown = true;
        return;
      }
      Plotly.extendTraces(plots["utilization-figure"], { x: [s.x], y: [s.utilization] }, [u]);
      Plotly.extendTraces(plots["memory-figure"], { x: [s.x], y: [s.memory] }, [m]);
    });
    return unknown;
  }

  const live = document.getElementById("live-indicator");

  function schedule() {
    if (live) {
      live.hidden = !state.running;
    }
    if (state.running) {
      window.setTimeout(poll, state.poll_ms);
    }
  }

  function poll() {
    const url = new URL(state.url, window.location.href);
    Object.keys(state.cursor).forEach(function (k) { url.searchParams.set(k, state.cursor[k]); });
    fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) {
          throw new Error("poll answered " + response.status);
        }
        return response.json();
      })
      .then(function (data) {
        const unknown = state.kind === "curves" ? applyCurves(data) || applyRewards(data.rewards) : applyDevices(data);
        updateTrials(data.trials);
        if (unknown) {
          // A trial or device the page does not draw yet (TPE asked for a new trial): draw the page afresh.
          window.location.reload();
          return;
        }
        state.cursor = data.cursor;
        state.running = data.running;
        schedule();
      })
      .catch(function (error) {
        // A server restart or a dropped connection: keep the page and try again on the next tick.
        console.warn("dashboard poll failed, retrying:", error.message);
        schedule();
      });
  }

  schedule();
}());
