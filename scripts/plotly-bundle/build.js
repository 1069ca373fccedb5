// Bundles entry.js as plotly.js's own build does (its esbuild-config.js: the same plugins, aliases and target),
// minified, into static/vendor/plotly.min.js, with its gzip-compressed copy (which the web server sends to
// browsers that take gzip, also under `make run`) and the licence texts of what it bundles beside it.
'use strict';

const fs = require('fs');
const path = require('path');
const zlib = require('zlib');
const esbuild = require('esbuild');
const { environmentPlugin } = require('esbuild-plugin-environment');
const { glsl } = require('esbuild-plugin-glsl');
const InlineCSSPlugin = require('esbuild-plugin-inline-css');

const version = require('plotly.js/package.json').version;
const traces = [...fs.readFileSync(path.join(__dirname, 'entry.js'), 'utf8')
    .matchAll(/require\('plotly\.js\/lib\/(\w+)'\)/g)].map((m) => m[1]).filter((name) => name !== 'core');
const vendor = path.join(__dirname, '..', '..', 'static', 'vendor');

esbuild.build({
    entryPoints: [path.join(__dirname, 'entry.js')],
    outfile: path.join(vendor, 'plotly.min.js'),
    format: 'iife',
    globalName: 'Plotly',
    bundle: true,
    minify: true,
    legalComments: 'external',
    banner: { js: `/* plotly.js v${version} (MIT licence, see plotly.LICENSE), traces: ${['scatter', ...traces].sort().join(', ')}; ` +
              'built by scripts/plotly-bundle (make plotly) */' },
    plugins: [InlineCSSPlugin(), glsl({ minify: true }), environmentPlugin({ NODE_DEBUG: false })],
    alias: { stream: 'stream-browserify' },
    define: { global: 'window', 'define.amd': 'false' },
    target: 'es2016',
    logLevel: 'info',
}).then(() => {
    const bundle = path.join(vendor, 'plotly.min.js');
    fs.writeFileSync(bundle + '.gz', zlib.gzipSync(fs.readFileSync(bundle), { level: 9 }));
    fs.renameSync(bundle + '.LEGAL.txt', path.join(vendor, 'plotly.LEGAL.txt'));
    fs.copyFileSync(require.resolve('plotly.js/LICENSE'), path.join(vendor, 'plotly.LICENSE'));
}).catch(() => process.exit(1));
