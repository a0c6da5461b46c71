"""Integration lab: runs the real `gpunode-agent run` on a fixture host and talks to it the way the
central API (HTTPS + JWT) and an operator (admin Unix socket) do.

One Lab is one temp dir holding:
  host/           a fixture host tree built by tests/fixtures/mkhost.py
  tls.crt/key     a self-signed P-256 server cert for 127.0.0.1 (openssl CLI)
  ca.crt/key      a client CA, and client.crt/key signed by it (for mTLS labs)
  NAME.crt/key    more client certificates, from make_client_cert() (e.g. for the central API)
  ed.pem/.pub     the Ed25519 token issuer (EdDSA)
  p256.pem/.pub   a P-256 token issuer (ES256)
  rogue.pem/.pub  an Ed25519 key that is never in auth.keys
  agent.yaml      written by write_config(); state/ the agent's state dir; agent.log its output

Every process the lab starts is stopped by its own PID (stop/kill); close() removes the dir.

Every answer Lab.call gets is checked against the API document, docs/openapi.yaml (ApiDocument):
the status must be one the operation documents, the required headers must be there, and the body
must match the schema of its status and content type (an undocumented route: what the document's
x-gpunode-other-routes says). A mismatch is a failed check of the running test. Python 3 stdlib, the openssl CLI, and
python3-jsonschema and python3-yaml (scripts/install-deps.sh) for the document.
"""
import base64
import calendar
import hashlib
import hmac
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

try:
    import jsonschema
    import yaml
except ImportError as _missing:  # loud: the document is checked on every answer, never skipped
    raise SystemExit(f"lab.py: the Python module {_missing.name!r} is missing; the integration tests check every "
                     "answer against docs/openapi.yaml with python3-jsonschema and python3-yaml "
                     "(scripts/install-deps.sh installs them)") from None

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(HERE), "fixtures")
CENTRAL = os.path.join(os.path.dirname(HERE), "central")
DEMO_HOST = os.path.join(FIXTURES, "hosts", "demo_node.py")
API_DOCUMENT = os.path.join(os.path.dirname(os.path.dirname(HERE)), "docs", "openapi.yaml")

NODE = "node-integ-1"
OWNER = "org-owner"
ISSUER = "https://central.integ.example"
AUDIENCE = "gpunode"

# demo_node.py's units
VFIO_UNITS = ["u-0000-23-00-0", "u-0000-24-00-0", "u-0000-43-00-0"]
DR_UNITS = ["u-0000-81-00-0", "u-0000-a1-00-0"]
RESERVABLE = VFIO_UNITS + DR_UNITS
NOT_RESERVABLE = ["u-0000-c1-00-0", "u-0000-e1-00-0"]
ALL_UNITS = sorted(RESERVABLE + NOT_RESERVABLE)

PROBLEM_KEYS = {"type", "title", "status", "detail", "code", "errors"}


# ---------------------------------------------------------------------------------------------
# small helpers

def b64u(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, **kw).stdout


def remove_tree(path, what):
    """Removes a test's temp dir, unless GPUNODE_INTEG_KEEP is set (then says where it is)."""
    if os.environ.get("GPUNODE_INTEG_KEEP"):
        print(f"# {what} kept at {path}", flush=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rfc3339(t):
    """Seconds since the epoch -> RFC 3339 UTC (whole seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(t)))


def parse_time(s):
    """RFC 3339 UTC with optional fraction -> float seconds since the epoch."""
    if s is None:
        return None
    assert s.endswith("Z"), s
    main, frac = s[:-1], 0.0
    if "." in main:
        main, f = main.split(".", 1)
        frac = float("0." + f)
    return calendar.timegm(time.strptime(main, "%Y-%m-%dT%H:%M:%S")) + frac


def der_to_raw_ecdsa(der, size=32):
    """openssl's DER ECDSA-Sig-Value (SEQUENCE {INTEGER r, INTEGER s}) -> raw R||S for JWS."""
    def read_len(b, i):
        n = b[i]
        i += 1
        if n & 0x80:
            k = n & 0x7F
            n = int.from_bytes(b[i:i + k], "big")
            i += k
        return n, i
    assert der[0] == 0x30, "not a DER sequence"
    _, i = read_len(der, 1)
    out = b""
    for _ in range(2):
        assert der[i] == 0x02, "not a DER integer"
        n, i = read_len(der, i + 1)
        v = int.from_bytes(der[i:i + n], "big")
        i += n
        out += v.to_bytes(size, "big")
    return out


def audit_hash(record):
    r = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(json.dumps(r, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False).encode("utf-8")).hexdigest()


def verify_chain(records):
    """Recompute CONTRACT §4's chain over records starting at aud_1; list of problems (empty: ok)."""
    problems = []
    prev = "0" * 64
    for i, r in enumerate(records, 1):
        if r.get("id") != f"aud_{i}":
            problems.append(f"record #{i} has id {r.get('id')!r}, want aud_{i}")
        if r.get("prevHash") != prev:
            problems.append(f"{r.get('id')}: prevHash {r.get('prevHash')!r}, want {prev!r}")
        h = audit_hash(r)
        if r.get("hash") != h:
            problems.append(f"{r.get('id')}: hash {r.get('hash')!r}, recomputed {h!r}")
        prev = r.get("hash")
    return problems


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


class Resp:
    """One HTTP answer: status, headers (lower-case keys), raw body, parsed JSON (or None)."""

    def __init__(self, status, headers, body):
        self.status, self.headers, self.body = status, headers, body
        try:
            self.json = json.loads(body) if body else None
        except ValueError:
            self.json = None

    def h(self, name):
        return self.headers.get(name.lower())

    def code(self):
        return self.json.get("code") if isinstance(self.json, dict) else None

    def __repr__(self):
        body = self.body[:400].decode(errors="replace")
        return f"{self.status} {body}"


# ---------------------------------------------------------------------------------------------
# the API document: every answer is checked against docs/openapi.yaml

class ApiDocument:
    """docs/openapi.yaml, loaded once per process; check() finds the operation of an answer
    (method and path template, on the transport that carried it) and returns what does not match
    (a list of strings; empty: it matches). Schema validators are built once per response."""

    def __init__(self, path=API_DOCUMENT):
        with open(path, encoding="utf-8") as f:
            self.doc = yaml.safe_load(f)
        self.path = path
        self.cls = jsonschema.Draft202012Validator
        self.routes = []  # (regex, template, path item)
        for template, item in self.doc["paths"].items():
            rx = "".join(f"(?P<{part[1:-1]}>[^/]+)" if part.startswith("{") else re.escape(part)
                         for part in re.split(r"(\{[^}/]+\})", template))
            self.routes.append((re.compile(rx + r"\Z"), template, item))
        self._validators = {}
        self._lock = threading.Lock()
        self.checked = 0

    def resolve(self, node):
        while isinstance(node, dict) and "$ref" in node and len(node) == 1:
            ref = node["$ref"]
            assert ref.startswith("#/"), ref
            node = self.doc
            for part in ref[2:].split("/"):
                node = node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def validator(self, key, schema):
        """A validator for `schema` (whose $refs point into the document), built once per key."""
        with self._lock:
            v = self._validators.get(key)
            if v is None:
                root = dict(schema)
                root["components"] = self.doc["components"]  # so "#/components/..." resolves
                v = self.cls(root, format_checker=self.cls.FORMAT_CHECKER)
                self._validators[key] = v
            return v

    def operation(self, method, path, transport):
        """(template, operation) documented for this call, or (None, None)."""
        for rx, template, item in self.routes:
            if rx.match(path):
                op = item.get(method.lower())
                if op is not None and transport in op.get("x-gpunode-transport", ["https"]):
                    return template, op
                return None, None
        return None, None

    def _schema_errors(self, key, schema, value):
        v = self.validator(key, schema)
        out = []
        for e in sorted(v.iter_errors(value), key=lambda e: list(e.absolute_path))[:3]:
            where = "/" + "/".join(str(p) for p in e.absolute_path)
            msg = f"body at {where}: {e.message[:200]} (schema {'/'.join(str(p) for p in e.absolute_schema_path)})"
            if e.context:  # oneOf/anyOf: the nearest miss says more
                branches = {}
                for c in e.context:
                    branches.setdefault(c.relative_schema_path[0], []).append(c)
                best = min(branches.values(), key=len)[0]
                msg += f"; nearest: at /{'/'.join(str(p) for p in best.absolute_path)}: {best.message[:200]}"
            out.append(msg)
        return out

    def component_errors(self, name, value):
        """What does not match components/schemas/NAME in value (empty: it matches)."""
        return self._schema_errors(("component", name), {"$ref": f"#/components/schemas/{name}"}, value)

    def check(self, method, target, transport, resp):
        """What does not match the document in this answer (empty: it matches)."""
        self.checked += 1
        path = urllib.parse.urlsplit(target).path
        template, op = self.operation(method, path, transport)
        ctype = (resp.h("content-type") or "").split(";")[0].strip().lower()
        if op is None:
            # An undocumented route (a probe, a method the path does not have, an admin-socket
            # route over HTTPS): as the document's x-gpunode-other-routes says (404 not-found,
            # 405 method-not-allowed with Allow, else any problem), whatever its code.
            template, method = "(other routes)", "*"
            responses = self.doc["x-gpunode-other-routes"]["responses"]
            if resp.status < 400:
                return [f"undocumented route answered {resp.status}"]
            documented = responses.get(str(resp.status)) or responses["default"]
        else:
            responses = op["responses"]
            documented = responses.get(str(resp.status))
            if documented is None:
                return [f"status {resp.status} is not documented (documented: {', '.join(sorted(responses))})"]
        documented = self.resolve(documented)
        problems = []
        for name, h in (documented.get("headers") or {}).items():
            h = self.resolve(h)
            value = resp.h(name)
            if value is None:
                if h.get("required"):
                    problems.append(f"header {name} is missing")
                continue
            if "schema" in h:
                key = ("header", template, method, resp.status, name)
                if not self.validator(key, h["schema"]).is_valid(value):
                    problems.append(f"header {name}: {value!r} does not match {h['schema']}")
        content = documented.get("content")
        if not content:
            if resp.body:
                problems.append(f"status {resp.status} documents no body; got {len(resp.body)} bytes")
            return problems
        media = content.get(ctype)
        if media is None:
            return problems + [f"content type {ctype!r} is not documented for {resp.status} (documented: {', '.join(content)})"]
        if not ctype.endswith("json"):
            return problems
        if resp.json is None and resp.body.strip() != b"null":
            return problems + ["the body is not JSON"]
        schema = (media.get("x-gpunode-schema-by-transport") or {}).get(transport) or media.get("schema")
        if schema is not None:
            problems += self._schema_errors((template, method, resp.status, ctype, transport), schema, resp.json)
        return problems


# ---------------------------------------------------------------------------------------------
# the API document as other tools read it (document_test.py runs these rules)
#
# Stoplight Prism dereferences a `$ref` that has sibling keywords by merging the two, the
# siblings' `properties` replacing the target's (so `unevaluatedProperties: false` beside a
# `$ref` rejected every answer); other generators and validators drop the siblings. So the
# document keeps to what every reader agrees on: a `$ref` stands alone (a description or summary
# beside it at most), no `unevaluated*` keywords, and each closed object lists its own properties
# under `additionalProperties: false`. Spectral's `spectral:oas` rules that matter here are
# checked too: every component used, `info.contact`, each operation's description, operationId
# and tags. scripts/check-api-document.sh runs Spectral and Prism themselves.

REF_SIBLINGS_ALLOWED = {"$ref", "description", "summary"}
# keywords whose subschemas only constrain the values of properties listed elsewhere
_CONDITIONAL = {"if", "then", "else", "not", "dependentSchemas", "contains", "propertyNames"}


def _walk(node, where=""):
    """(pointer, dict) for every mapping in node, depth first."""
    if isinstance(node, dict):
        yield where, node
        for k, v in node.items():
            yield from _walk(v, f"{where}/{str(k).replace('~', '~0').replace('/', '~1')}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{where}/{i}")


def _operations(doc):
    """(where, operation) for every operation under paths and webhooks."""
    for section in ("paths", "webhooks"):
        for name, item in (doc.get(section) or {}).items():
            for method, op in item.items():
                if method in ("get", "put", "post", "delete", "options", "head", "patch", "trace"):
                    yield f"{section} {name} {method}", op


def _closed_object_problems(doc, schema, where, seen, out, conditional=False):
    """Every object schema an answer can take lists its properties under
    additionalProperties: false (subschemas of if/then/else and the like only constrain)."""
    if isinstance(schema, list):
        for i, s in enumerate(schema):
            _closed_object_problems(doc, s, f"{where}/{i}", seen, out, conditional)
        return
    if not isinstance(schema, dict):
        return
    if "$ref" in schema:
        ref = schema["$ref"]
        if ref in seen:
            return
        seen.add(ref)
        target = doc
        for part in ref[2:].split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        _closed_object_problems(doc, target, ref, seen, out, conditional)
        return
    if not conditional and ("properties" in schema or schema.get("type") == "object"):
        if schema.get("additionalProperties") is not False:
            out.append(f"{where}: an object in an answer without additionalProperties: false")
    for k, v in schema.items():
        if k in ("properties", "patternProperties", "$defs", "dependentSchemas"):
            for name, sub in (v or {}).items():
                _closed_object_problems(doc, sub, f"{where}/{k}/{name}", seen, out,
                                        conditional or k == "dependentSchemas")
        elif k in ("items", "prefixItems", "additionalProperties", "allOf", "anyOf", "oneOf",
                   "if", "then", "else", "not", "contains", "propertyNames"):
            _closed_object_problems(doc, v, f"{where}/{k}", seen, out, conditional or k in _CONDITIONAL)


def document_rules(doc):
    """{rule: [what breaks it]} for the document as a dict (docs/openapi.yaml loaded)."""
    rules = {}
    # 1. a $ref stands alone: Prism merges its siblings into the target, others drop them
    rules["no $ref has sibling keywords other than description and summary"] = [
        f"{w}: $ref beside {sorted(set(n) - REF_SIBLINGS_ALLOWED)}"
        for w, n in _walk(doc) if "$ref" in n and set(n) - REF_SIBLINGS_ALLOWED]
    rules["no unevaluatedProperties or unevaluatedItems (closed objects list their own properties)"] = [
        f"{w}: {k}" for w, n in _walk(doc) for k in ("unevaluatedProperties", "unevaluatedItems") if k in n]
    rules["every $ref points into this document, at something there"] = []
    for w, n in _walk(doc):
        ref = n.get("$ref")
        if not isinstance(ref, str):
            continue
        target = doc if ref.startswith("#/") else None
        for part in ref[2:].split("/") if target is not None else []:
            target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, dict) else None
        if target is None:
            rules["every $ref points into this document, at something there"].append(f"{w}: {ref}")
    # 2. what Spectral's spectral:oas ruleset warns about
    reached, todo = set(), [f"#/{k}" for k in doc if k != "components"]
    while todo:
        ptr = todo.pop()
        node = doc
        for part in ptr[2:].split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        for _, n in _walk(node):
            ref = n.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/") and ref not in reached:
                reached.add(ref)
                todo.append(ref)
    schemes = {name for _, op in list(_operations(doc)) + [("", doc)]
               for req in op.get("security") or [] for name in req}
    unused = []
    for kind, items in doc["components"].items():
        for name in items:
            used = name in schemes if kind == "securitySchemes" else \
                f"#/components/{kind}/{name.replace('~', '~0').replace('/', '~1')}" in reached
            if not used:
                unused.append(f"components/{kind}/{name}")
    rules["every component is used (oas3-unused-component)"] = unused
    info = doc.get("info") or {}
    rules["info has a contact, a description and a license (info-contact, info-description)"] = [
        f"info.{k} is missing" for k in ("contact", "description", "license") if not info.get(k)] + (
        [] if (info.get("contact") or {}).get("email") or (info.get("contact") or {}).get("url")
        else ["info.contact has neither email nor url"])
    declared = [t["name"] for t in doc.get("tags") or []]
    ids, bad, used_tags = {}, [], set()
    for where, op in _operations(doc):
        for k in ("summary", "description", "operationId"):
            if not (isinstance(op.get(k), str) and op[k].strip()):
                bad.append(f"{where}: no {k}")
        if op.get("operationId") in ids:
            bad.append(f"{where}: operationId {op['operationId']} is also {ids[op['operationId']]}'s")
        ids[op.get("operationId")] = where
        if not op.get("tags"):
            bad.append(f"{where}: no tags")
        for t in op.get("tags") or []:
            used_tags.add(t)
            if t not in declared:
                bad.append(f"{where}: tag {t} is not declared under tags")
        if not op.get("responses"):
            bad.append(f"{where}: no responses")
        if not op.get("x-gpunode-transport"):
            bad.append(f"{where}: no x-gpunode-transport")
        for code, r in (op.get("responses") or {}).items():
            r = r if "$ref" not in r else None
            if r is not None and not r.get("description"):
                bad.append(f"{where} {code}: a response without description")
    bad += [f"tag {t} is declared but no operation has it" for t in declared if t not in used_tags]
    rules["every operation has a summary, description, unique operationId, declared tags, responses and "
          "transports (operation-description, operation-operationId, operation-tags)"] = bad
    # 3. closed answers, as lab.py's checks and Prism's read them alike
    closed, seen = [], set()
    for where, op in _operations(doc):
        if not where.startswith("paths "):
            continue  # the webhooks' payloads are the central API's to close or not
        for code, r in (op.get("responses") or {}).items():
            if "$ref" in r:
                r = doc["components"]["responses"][r["$ref"].rsplit("/", 1)[1]]
            for ctype, media in (r.get("content") or {}).items():
                if ctype.endswith("json"):
                    _closed_object_problems(doc, media.get("schema"), f"{where} {code} {ctype}", seen, closed)
    rules["every object an answer can hold is closed by additionalProperties: false"] = closed
    rules["every schema's examples are valid against it (oas3-valid-schema-example)"] = [
        f"{w}: example {e!r}: {err.message[:120]}"
        for w, n in _walk(doc["components"]["schemas"], "#/components/schemas")
        if isinstance(n.get("examples"), list) and ("type" in n or "pattern" in n or "enum" in n)
        for e in n["examples"]
        for err in list(jsonschema.Draft202012Validator(
            {k: v for k, v in n.items() if k != "examples"},
            format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER).iter_errors(e))[:1]]
    # 4. each problem lists the keys every problem has (ProblemFields was once their $ref)
    s = doc["components"]["schemas"]
    bad = []
    listed = {o.get("$ref", "").rsplit("/", 1)[-1] for o in s["Problem"].get("oneOf", [])}
    for name, p in s.items():
        if not name.endswith("Problem") or name == "Problem":
            continue
        props, code = p.get("properties") or {}, (p.get("properties") or {}).get("code", {}).get("const")
        if name not in listed:
            bad.append(f"{name} is not among Problem's oneOf")
        if not set(PROBLEM_KEYS) <= set(p.get("required") or []):
            bad.append(f"{name} does not require all of {sorted(PROBLEM_KEYS)}")
        if not code or props.get("type", {}).get("const") != f"urn:gpunode:problem:{code}":
            bad.append(f"{name}: type is not urn:gpunode:problem:CODE for its code const")
        if not 400 <= (props.get("status", {}).get("const") or 0) <= 599:
            bad.append(f"{name}: status is not a const from 400 to 599")
        if props.get("title") != {"type": "string", "minLength": 1} or props.get("detail") != {"type": "string"}:
            bad.append(f"{name}: title or detail is not as every problem has it")
        errors = props.get("errors") or {}
        if errors != {"$ref": "#/components/schemas/FieldErrors"} and not (
                errors.get("type") == "array" and errors.get("items") == {"$ref": "#/components/schemas/FieldError"}):
            bad.append(f"{name}: errors is not an array of FieldError")
    rules["every …Problem has the keys every problem has, type urn:gpunode:problem:CODE, and is a Problem"] = bad
    # 5. the reservation's copies stay one reservation
    s = doc["components"]["schemas"]
    base, spot = s["Reservation"], s["ReservationWithSpot"]
    drift = []
    if {k: v for k, v in (spot.get("properties") or {}).items() if k != "spotWorkloads"} != base.get("properties"):
        drift.append("ReservationWithSpot's properties are not Reservation's and spotWorkloads")
    if [r for r in spot.get("required") or [] if r != "spotWorkloads"] != base.get("required"):
        drift.append("ReservationWithSpot's required keys are not Reservation's and spotWorkloads")
    for k in ("if", "then", "else"):
        if spot.get(k) != base.get(k):
            drift.append(f"ReservationWithSpot's {k} is not Reservation's")
    rules["ReservationWithSpot is Reservation with spotWorkloads, key for key"] = drift
    return rules


_API_DOC = None
_API_DOC_LOCK = threading.Lock()
_CURRENT_CHECKS = None  # the running test's Checks: a mismatch is one of its failed checks


def api_document():
    global _API_DOC
    with _API_DOC_LOCK:
        if _API_DOC is None:
            _API_DOC = ApiDocument()
        return _API_DOC


_TRAFFIC = os.environ.get("GPUNODE_API_TRAFFIC")  # a file: every exchange appended, one JSON line each
_TRAFFIC_LOCK = threading.Lock()


def record_exchange(method, target, transport, req_headers, req_body, resp):
    """With GPUNODE_API_TRAFFIC set, appends the exchange to that file (one JSON line), for
    scripts/check-api-document.sh, which has Stoplight Prism's validator read the same traffic."""
    if not _TRAFFIC:
        return
    doc = api_document()
    template, _ = doc.operation(method, urllib.parse.urlsplit(target).path, transport)
    line = json.dumps({
        "method": method, "target": target, "transport": transport, "template": template,
        "request": {"headers": {k.lower(): v for k, v in (req_headers or {}).items()},
                    "body": (req_body or b"").decode(errors="replace")},
        "status": resp.status, "headers": resp.headers, "body": resp.body.decode(errors="replace"),
    })
    with _TRAFFIC_LOCK, open(_TRAFFIC, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def check_against_document(method, target, transport, resp, req_headers=None, req_body=None):
    """Checks one answer against docs/openapi.yaml; a mismatch fails the running test."""
    record_exchange(method, target, transport, req_headers, req_body, resp)
    problems = api_document().check(method, target, transport, resp)
    if not problems:
        return
    path = urllib.parse.urlsplit(target).path
    label = f"openapi: {method} {path} via {transport} answered {resp.status} as docs/openapi.yaml says"
    got = "; ".join(problems) + f"; body: {resp.body[:300].decode(errors='replace')}"
    if _CURRENT_CHECKS is None:
        raise AssertionError(f"{label}: {got}")
    _CURRENT_CHECKS.check(label, False, got)


# ---------------------------------------------------------------------------------------------
# checks: one line each, "N passed, M failed" at the end

class Checks:
    def __init__(self, name):
        global _CURRENT_CHECKS
        self.name, self.passed, self.failed = name, 0, 0
        self.lock = threading.Lock()
        _CURRENT_CHECKS = self

    def check(self, label, cond, got=""):
        with self.lock:
            if cond:
                self.passed += 1
                print(f"ok   {label}", flush=True)
            else:
                self.failed += 1
                print(f"FAIL {label}: got {got}", flush=True)
        return bool(cond)

    def eq(self, label, got, want):
        return self.check(label, got == want, f"{got!r}; want {want!r}")

    def status(self, label, resp, want, code=None):
        """The status (and problem code) of one answer."""
        ok = resp.status == want and (code is None or resp.code() == code)
        w = f"{want}" + (f" {code}" if code else "")
        return self.check(label, ok, f"{resp!r}; want {w}")

    def problem(self, label, resp, want, code=None):
        """A problem+json answer with every key of CONTRACT §7."""
        ok = (resp.status == want and (code is None or resp.code() == code)
              and (resp.h("content-type") or "").startswith("application/problem+json")
              and isinstance(resp.json, dict) and PROBLEM_KEYS <= set(resp.json)
              and resp.json.get("status") == want and isinstance(resp.json.get("errors"), list)
              and resp.json.get("type") == f"urn:gpunode:problem:{resp.json.get('code')}")
        w = f"{want}" + (f" {code}" if code else "") + " problem+json with " + ",".join(sorted(PROBLEM_KEYS))
        return self.check(label, ok, f"{resp!r} content-type={resp.h('content-type')!r}; want {w}")

    def finish(self):
        if _API_DOC is not None:
            print(f"# {_API_DOC.checked} answers checked against docs/openapi.yaml", flush=True)
        print(f"{self.passed} passed, {self.failed} failed", flush=True)
        return 1 if self.failed else 0


# ---------------------------------------------------------------------------------------------
# the lab

class Lab:
    def __init__(self, agent, host=DEMO_HOST, mtls=False):
        self.agent = os.path.abspath(agent)
        self.proc, self.logf = None, None
        self.mtls = mtls
        self.dir = tempfile.mkdtemp(prefix="gpunode-integ-")
        self._n = 0
        self._nlock = threading.Lock()
        self._tokens = {}
        try:
            self._setup(host)
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    # -- setup ------------------------------------------------------------------------------
    def _setup(self, host):
        d = self.dir
        self.root = os.path.join(d, "host")
        sh([sys.executable, os.path.join(FIXTURES, "mkhost.py"), host, self.root])
        self.sock = os.path.join(d, "admin.sock")
        self.state = os.path.join(d, "state")
        self.port = free_port()
        # server cert
        sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{d}/tls.key", "-out", f"{d}/tls.crt", "-days", "2", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        # token keys
        for name, alg in (("ed", ["-algorithm", "ed25519"]), ("rogue", ["-algorithm", "ed25519"]),
                          ("p256", ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"])):
            sh(["openssl", "genpkey", *alg, "-out", f"{d}/{name}.pem"])
            sh(["openssl", "pkey", "-in", f"{d}/{name}.pem", "-pubout", "-out", f"{d}/{name}.pub"])
        with open(f"{d}/ed.pub", "rb") as f:
            self.ed_pub_pem = f.read()
        # client CA and a client cert signed by it (used when mtls)
        sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.crt", "-days", "2", "-subj", "/CN=integ client CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"])
        self.make_client_cert("client", "central")
        self.ctx = self.client_context()
        self.cfg = os.path.join(d, "agent.yaml")
        self.write_config()

    def make_ca(self, name, cn):
        """A CA NAME.crt/NAME.key in the lab dir."""
        d = self.dir
        sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{d}/{name}.key", "-out", f"{d}/{name}.crt", "-days", "2", "-subj", f"/CN={cn}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"])

    def make_client_cert(self, name, cn, ca="ca"):
        """A TLS client certificate NAME.crt/NAME.key with subject CN=cn, signed by the lab CA `ca`."""
        d = self.dir
        sh(["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{d}/{name}.key", "-out", f"{d}/{name}.csr", "-subj", f"/CN={cn}"])
        with open(f"{d}/{name}.ext", "w") as f:
            f.write("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n")
        sh(["openssl", "x509", "-req", "-in", f"{d}/{name}.csr", "-CA", f"{d}/{ca}.crt", "-CAkey", f"{d}/{ca}.key",
            "-CAcreateserial", "-out", f"{d}/{name}.crt", "-days", "2", "-extfile", f"{d}/{name}.ext"])
        return f"{d}/{name}.crt", f"{d}/{name}.key"

    def fake_central(self):
        """A fake central API (tests/central/fake_central.py) on 127.0.0.1 with this lab's server
        certificate (tls.crt, which the agent then trusts as central.ca), accepting client
        certificates of the lab CA (ca.crt). The caller closes it."""
        if CENTRAL not in sys.path:
            sys.path.insert(0, CENTRAL)
        import fake_central
        return fake_central.FakeCentral(f"{self.dir}/tls.crt", f"{self.dir}/tls.key", f"{self.dir}/ca.crt", NODE)

    def central_text(self, url, client="client", heartbeat="1s", ca=None):
        """The `central:` section for reporting to `url` with client cert CLIENT.crt/key."""
        d = self.dir
        return (f"central:\n  url: \"{url}\"\n  ca: {ca or d + '/tls.crt'}\n  client_cert: {d}/{client}.crt\n"
                f"  client_key: {d}/{client}.key\n  heartbeat_interval: {heartbeat}\n")

    def client_context(self, cert=None):
        ctx = ssl.create_default_context(cafile=f"{self.dir}/tls.crt")
        if cert is None and self.mtls:
            cert = True
        if cert:
            ctx.load_cert_chain(f"{self.dir}/client.crt", f"{self.dir}/client.key")
        return ctx

    def config_text(self, keys=("ed",), log_level="info", extra_node="", client_ca=None, admin_uids=None, central="",
                    metrics_listen="", health=""):
        """agent.yaml for this lab; `health`: the text of a `health:` section (else its defaults)."""
        d = self.dir
        if client_ca is None:
            client_ca = self.mtls
        ca = f"\n    client_ca: {d}/ca.crt" if client_ca else ""
        keylist = ", ".join(f"{d}/{k}.pub" for k in keys)
        return f"""node:
  id: {NODE}
  owner_org: {OWNER}
  unsellable_units: []{extra_node}
discovery:
  host_root: {self.root}
  rescan_interval: 30s
api:
  listen: "127.0.0.1:{self.port}"
  tls:
    cert: {d}/tls.crt
    key: {d}/tls.key{ca}
auth:
  issuer: {ISSUER}
  audience: {AUDIENCE}
  keys: [{keylist}]
admin:
  socket: {self.sock}
  allowed_uids: [{os.getuid() if admin_uids is None else ", ".join(map(str, admin_uids))}]
libvirt:
  uri: test:///default
  shutdown_grace: 0s
{central}metrics:
  listen: "{metrics_listen}"
{health}state:
  dir: {self.state}
log:
  level: {log_level}
"""

    def write_config(self, text=None, **kw):
        tmp = self.cfg + ".tmp"
        with open(tmp, "w") as f:
            f.write(text if text is not None else self.config_text(**kw))
        os.replace(tmp, self.cfg)

    def _tmpname(self, stem):
        with self._nlock:
            self._n += 1
            return os.path.join(self.dir, f"{stem}.{self._n}")

    # -- process ----------------------------------------------------------------------------
    def start(self, wait=20, env=None):
        """Start the agent (with `env` added to the environment); returns once /healthz answers 200.
        Raises with the log tail otherwise."""
        assert self.proc is None or self.proc.poll() is not None, "agent already running"
        self.logf = open(os.path.join(self.dir, "agent.log"), "ab")
        self.proc = subprocess.Popen([self.agent, "run", "--config", self.cfg], stdout=self.logf,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     env=dict(os.environ, **(env or {})))
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent exited {self.proc.returncode}: {self.tail()}")
            try:
                if self.get("/healthz", token=None, timeout=2).status == 200:
                    return
            except (OSError, http.client.HTTPException, ssl.SSLError):
                pass
            time.sleep(0.05)
        raise RuntimeError(f"no 200 from /healthz within {wait}s: {self.tail()}")

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.running():
            os.kill(self.proc.pid, sig)

    def stop(self, timeout=10):
        """SIGTERM by PID; returns (exit code, seconds taken); kill -9 if it overstays."""
        rc, took = None, 0.0
        if self.running():
            t0 = time.monotonic()
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                rc = "timeout"
            took = time.monotonic() - t0
        self._closelog()
        return rc, took

    def kill(self):
        """SIGKILL by PID (a crash)."""
        if self.running():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._closelog()

    def _closelog(self):
        self.proc = None if self.proc is None or self.proc.poll() is not None else self.proc
        if self.logf:
            self.logf.close()
            self.logf = None

    def log(self):
        try:
            with open(os.path.join(self.dir, "agent.log"), "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_line(self, *needles, since=0, timeout=5.0):
        """The first line of the log after byte `since` that holds every needle, waiting up to
        `timeout` seconds for it (a request's lines are written just after its answer); "" if none."""
        deadline = time.monotonic() + timeout
        while True:
            line = next((x for x in self.log()[since:].splitlines() if all(n in x for n in needles)), "")
            if line or time.monotonic() >= deadline:
                return line
            time.sleep(0.02)

    def tail(self, n=1500):
        if self.logf:
            self.logf.flush()
        return self.log()[-n:].strip()

    def close(self):
        try:
            if self.running():
                self.kill()
        finally:
            remove_tree(self.dir, "lab")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- tokens -----------------------------------------------------------------------------
    def _claims(self, org=None, roles=None, sub=None, exp=600, nbf=None, iss=ISSUER, aud=AUDIENCE):
        now = int(time.time())
        c = {"iss": iss, "aud": aud, "sub": sub or f"user@{org or 'platform'}", "iat": now, "exp": now + exp}
        if org:
            c["org"] = org
        if roles:
            c["roles"] = list(roles)
        if nbf is not None:
            c["nbf"] = now + nbf
        return c

    def _sign(self, alg, key, signing):
        msg = self._tmpname("jwt.msg")
        with open(msg, "w") as f:
            f.write(signing)
        try:
            if alg == "EdDSA":
                return sh(["openssl", "pkeyutl", "-sign", "-inkey", f"{self.dir}/{key}.pem", "-rawin", "-in", msg])
            der = sh(["openssl", "dgst", "-sha256", "-sign", f"{self.dir}/{key}.pem", msg])
            return der_to_raw_ecdsa(der)
        finally:
            os.unlink(msg)

    def jwt(self, claims, alg="EdDSA", key=None, header=None):
        """A JWS signed as `alg` (EdDSA or ES256) with `key`; `header` overrides what it claims."""
        key = key or ("ed" if alg == "EdDSA" else "p256")
        hdr = header or {"alg": alg, "typ": "JWT"}
        signing = b64u(json.dumps(hdr).encode()) + "." + b64u(json.dumps(claims).encode())
        return signing + "." + b64u(self._sign(alg, key, signing))

    def token(self, org=None, roles=(), alg="EdDSA", **kw):
        """A valid token (cached per caller for a minute)."""
        ck = (org, tuple(roles), alg, tuple(sorted(kw.items())))
        hit = self._tokens.get(ck)
        if hit and hit[0] > time.time() - 60:
            return hit[1]
        t = self.jwt(self._claims(org=org, roles=roles, **kw), alg=alg)
        self._tokens[ck] = (time.time(), t)
        return t

    def admin(self, alg="EdDSA"):
        return self.token(org="org-platform", roles=["platform-admin"], alg=alg)

    def bad_tokens(self):
        """{kind: token} for every kind of token CONTRACT §4 says is 401."""
        good = self._claims(org=OWNER, roles=["platform-admin"])
        head = b64u(json.dumps({"alg": "EdDSA", "typ": "JWT"}).encode())
        body = b64u(json.dumps(good).encode())
        out = {}
        out["alg-none"] = b64u(json.dumps({"alg": "none", "typ": "JWT"}).encode()) + "." + body + "."
        hs_head = b64u(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        hs_sig = hmac.new(self.ed_pub_pem, (hs_head + "." + body).encode(), hashlib.sha256).digest()
        out["hs256-public-key"] = hs_head + "." + body + "." + b64u(hs_sig)
        valid = self.jwt(good)
        sig = bytearray(base64.urlsafe_b64decode(valid.split(".")[2] + "=="))
        sig[5] ^= 0x01
        out["bad-signature"] = head + "." + body + "." + b64u(bytes(sig))
        out["expired"] = self.jwt(self._claims(org=OWNER, roles=["platform-admin"], exp=-300))
        out["nbf-future"] = self.jwt(self._claims(org=OWNER, roles=["platform-admin"], nbf=600, exp=1200))
        out["wrong-iss"] = self.jwt(self._claims(org=OWNER, roles=["platform-admin"], iss="https://evil.example"))
        out["wrong-aud"] = self.jwt(self._claims(org=OWNER, roles=["platform-admin"], aud="someone-else"))
        out["unknown-key"] = self.jwt(good, key="rogue")
        out["es256-key-not-listed"] = self.jwt(good, alg="ES256")  # P-256 key is not in keys by default
        out["two-parts"] = head + "." + body
        out["bad-base64"] = head + ".@@@!!!." + b64u(bytes(sig))
        out["garbage"] = "not-a-jwt"
        return out

    # -- HTTP -------------------------------------------------------------------------------
    def conn(self, unix=False, timeout=15, ctx=None):
        if unix:
            return UnixHTTPConnection(self.sock, timeout)
        return http.client.HTTPSConnection("127.0.0.1", self.port, context=ctx or self.ctx, timeout=timeout)

    def call(self, method, path, token=None, body=None, raw=None, headers=None, unix=False, timeout=15, ctx=None):
        h = dict(headers or {})
        if token:
            h["Authorization"] = "Bearer " + token
        data = raw
        if body is not None:
            data = json.dumps(body).encode()
        if data is not None:
            h.setdefault("Content-Type", "application/json")
        c = self.conn(unix, timeout, ctx)
        try:
            c.request(method, path, body=data, headers=h)
            r = c.getresponse()
            resp = Resp(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        finally:
            c.close()
        check_against_document(method, path, "admin-socket" if unix else "https", resp, h, data)
        return resp

    def get(self, path, token=None, **kw):
        return self.call("GET", path, token=token, **kw)

    # -- API shorthands (admin socket unless a token is given) ------------------------------
    def npath(self, rest="", node=NODE):
        return f"/v1/nodes/{node}{rest}"

    def create(self, token=None, **body):
        return self.call("POST", self.npath("/reservations"), token=token, body=body, unix=token is None)

    def audit_all(self, token=None, limit=500):
        """Every audit record, following nextPageToken."""
        out, tok = [], None
        while True:
            q = f"?limit={limit}" + (f"&pageToken={tok}" if tok else "")
            r = self.call("GET", self.npath("/audit" + q), token=token, unix=token is None)
            if r.status != 200:
                raise RuntimeError(f"audit read failed: {r!r}")
            out += r.json["records"]
            tok = r.json.get("nextPageToken")
            if not tok:
                return out

    def reservations_all(self, token=None, state=None):
        out, tok = [], None
        while True:
            q = "?limit=500" + (f"&state={state}" if state else "") + (f"&pageToken={tok}" if tok else "")
            r = self.call("GET", self.npath("/reservations" + q), token=token, unix=token is None)
            if r.status != 200:
                raise RuntimeError(f"reservation list failed: {r!r}")
            out += r.json["reservations"]
            tok = r.json.get("nextPageToken")
            if not tok:
                return out


def run_main(name, body):
    """Entry point for a test file: body(checks, agent) inside try/finally; exit 1 on any failure."""
    if len(sys.argv) < 2:
        print(f"usage: {sys.argv[0]} PATH/TO/gpunode-agent", file=sys.stderr)
        return 2
    checks = Checks(name)
    try:
        body(checks, sys.argv[1])
    except Exception as e:  # a crash of the test itself is one failed check
        import traceback
        traceback.print_exc()
        checks.check(f"{name} ran to the end", False, f"{type(e).__name__}: {e}")
    return checks.finish()


def run_with_central(name, body):
    """run_main for a test of reporting: body(checks, lab, fake_central) with both closed after."""
    def main(c, agent):
        with Lab(agent) as lab:
            fc = lab.fake_central()
            try:
                body(c, lab, fc)
            finally:
                fc.close()
            # What the agent reported matches the API document's Event and Heartbeat (CONTRACT §6).
            doc = api_document()
            with fc.lock:
                events, beats = list(fc.events.values()), [h["body"] for h in fc.heartbeats]
            bad = [f"seq {e.get('seq')} {e.get('type')}: {p}" for e in events for p in doc.component_errors("Event", e)]
            c.check(f"openapi: every event the central API got ({len(events)}) matches components/schemas/Event",
                    not bad, "; ".join(bad[:5]))
            bad = [p for b in beats for p in doc.component_errors("Heartbeat", b)]
            c.check(f"openapi: every heartbeat ({len(beats)}) matches components/schemas/Heartbeat", not bad, "; ".join(bad[:5]))
    return run_main(name, main)
