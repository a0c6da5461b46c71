#!/usr/bin/env node
// Has Stoplight Prism's HTTP validator (@stoplight/prism-http, the code its validating proxy
// runs on every request and answer) read the integration tests' traffic against
// docs/openapi.yaml, and prints every violation it finds.
//
//   NODE_PATH=DIR/node_modules node prism_check.js docs/openapi.yaml TRAFFIC.jsonl
//
// TRAFFIC.jsonl: one exchange a line, as tests/integration/lab.py writes them when
// GPUNODE_API_TRAFFIC names the file. Each answer is routed and validated as the proxy would
// (status, content type, headers, body); the request too when the agent accepted it (a status
// below 400: a request the agent took must be one the document allows). Exchanges lab.py judged
// undocumented (a probe of a path or method the document does not have, an admin-socket route
// called over HTTPS) have no operation for Prism either, and are counted, not validated.
// scripts/check-api-document.sh installs Prism and runs this. Exits 1 on any violation.
'use strict';
const fs = require('fs');
const path = require('path');
const { getHttpOperationsFromSpec } = require('@stoplight/prism-http');
const route = require('@stoplight/prism-http/dist/router').default;
const { validateInput, validateOutput } = require('@stoplight/prism-http/dist/validator');
const E = require('fp-ts/Either');

function parseBody(text, contentType) {
  if (!text) return undefined;
  if (/json/i.test(contentType || '')) {
    try { return JSON.parse(text); } catch (e) { return text; }
  }
  return text;
}

function query(target) {
  const out = {};
  for (const [k, v] of new URL(target, 'http://x').searchParams) {
    if (k in out) out[k] = [].concat(out[k], v); else out[k] = v;
  }
  return out;
}

async function main() {
  const [docPath, trafficPath] = process.argv.slice(2);
  if (!docPath || !trafficPath) {
    console.error('usage: prism_check.js OPENAPI.yaml TRAFFIC.jsonl');
    process.exit(2);
  }
  const resources = await getHttpOperationsFromSpec(path.resolve(docPath));
  const lines = fs.readFileSync(trafficPath, 'utf8').split('\n').filter(Boolean);
  let validated = 0, undocumented = 0, violations = 0;
  const seen = new Map(); // one line per distinct violation, with its count
  for (const line of lines) {
    const x = JSON.parse(line);
    if (x.template === null) { undocumented++; continue; }
    const u = new URL(x.target, 'http://x');
    const input = {
      method: x.method.toLowerCase(),
      url: { path: u.pathname, query: query(x.target) },
      headers: x.request.headers,
      body: parseBody(x.request.body, x.request.headers['content-type']),
    };
    const routed = route({ resources, input });
    if (E.isLeft(routed)) {
      violations++;
      const key = `${x.method} ${x.template}: not routed: ${routed.left.message}`;
      seen.set(key, (seen.get(key) || 0) + 1);
      continue;
    }
    const resource = routed.right;
    validated++;
    const output = {
      statusCode: x.status,
      headers: x.headers,
      body: parseBody(x.body, x.headers['content-type']),
    };
    const found = [];
    const out = validateOutput({ resource, element: output });
    if (E.isLeft(out)) found.push(...out.left.map(d => ['answer', d]));
    if (x.status < 400) {
      const inp = validateInput({ resource, element: input });
      if (E.isLeft(inp)) found.push(...inp.left.map(d => ['request', d]));
    }
    for (const [what, d] of found) {
      violations++;
      const key = `${x.method} ${x.template} ${x.status} (${x.transport}): ${what}: ${d.message}` +
                  (d.path && d.path.length ? ` at /${d.path.join('/')}` : '');
      seen.set(key, (seen.get(key) || 0) + 1);
    }
  }
  for (const [key, n] of seen) console.log(`violation: ${key}${n > 1 ? ` (x${n})` : ''}`);
  console.log(`prism ${require('@stoplight/prism-http/package.json').version}: ${lines.length} exchanges, ` +
              `${validated} validated, ${undocumented} on routes the document does not have, ${violations} violations`);
  if (validated === 0) {
    console.error('no exchange validated: the traffic is empty or none of it is on the document\'s routes');
    process.exit(1);
  }
  process.exit(violations ? 1 : 0);
}

main().catch(e => { console.error(e); process.exit(2); });
