// The plotly.js that Hydra's pages load: its core (which draws `scatter`) and the traces the figures use
// (webapp/*/figures.py). A figure with another trace type needs it registered here, then `make plotly`.
'use strict';

var Plotly = require('plotly.js/lib/core');

Plotly.register([
    require('plotly.js/lib/bar'),
    require('plotly.js/lib/parcoords'),
    require('plotly.js/lib/scattergl'),
]);

module.exports = Plotly;
