#!/usr/bin/env python3
"""The alerting rules and the dashboard the package ships (CONTRACT §12) against the real agent:
`promtool check rules` and `promtool test rules` on packaging/prometheus/, the shape of every
alert (for, severity, annotations naming the node), then the agent started on the demo host and
/metrics scraped over the admin socket: every metric named in an alert expression, a dashboard
panel's query or a dashboard variable must be a series the agent exposes (a histogram by its
_bucket, _sum or _count series), rate() and increase() only over counters, and every metric family
the agent exposes on some panel. The dashboard must be JSON Grafana reads: a prometheus
`datasource` variable, a node variable, every panel with that datasource and its queries.

promtool (Debian package prometheus, installed by scripts/install-deps.sh) must be on PATH: the
test fails without it.

    alerts_test.py PATH/TO/gpunode-agent"""
import json
import os
import re
import shutil
import subprocess
import sys

import yaml

sys.dont_write_bytecode = True
import lab as L  # noqa: E402
from metrics_test import parse  # noqa: E402

SOURCE = os.path.dirname(os.path.dirname(L.HERE))
RULES = os.path.join(SOURCE, "packaging", "prometheus", "gpunode-alerts.yaml")
RULE_TESTS = os.path.join(SOURCE, "packaging", "prometheus", "gpunode-alerts.test.yaml")
DASHBOARD = os.path.join(SOURCE, "packaging", "grafana", "gpunode.json")

# What CONTRACT §12 asks for at least (each by the metric it watches), and the agent being down.
REQUIRED = {
    "GpunodeOutboxBacklog": "gpunode_outbox_oldest_undelivered_age_seconds",
    "GpunodeLibvirtDisconnected": "gpunode_libvirt_connected",
    "GpunodeCentralDeliveryFailing": "gpunode_central_delivery_failures_total",
    "GpunodeTerminationsFailing": "gpunode_terminations_total",
    "GpunodeUnentitledWorkloads": "gpunode_unentitled_workloads",
    "GpunodeDomainRefused": "gpunode_domain_admissions_total",
    "GpunodeAgentDown": "up",
    "GpunodeUnitFailing": "gpunode_unit_failing",  # CONTRACT §13
}
# Series Prometheus writes itself for every scrape target, not the agent: allowed in rules only.
PROMETHEUS_SERIES = {"up"}
SEVERITIES = {"critical", "warning"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")

# PromQL's keywords that may stand where a metric name could; a function or an aggregation is
# known by the `(` after it, and a label list by the keyword before it (`by (...)`).
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right",
            "atan2", "inf", "nan"}
STRING_RE = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
LABEL_LIST_RE = re.compile(r'\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)', re.IGNORECASE)
IDENT_RE = re.compile(r'(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])')
RATE_RE = re.compile(r'\b(rate|irate|increase)\s*\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)')


def strip_promql(expr):
    """The expression without strings, label matchers, ranges and label lists: what is left of it
    is metric names, functions, keywords, numbers and operators."""
    s = STRING_RE.sub('""', expr)
    s = re.sub(r'\{[^}]*\}', " ", s)
    s = re.sub(r'\[[^\]]*\]', " ", s)
    return LABEL_LIST_RE.sub(" ", s)


def metric_names(expr):
    """The metric names an expression reads, e.g. {'gpunode_units'} for
    `sum by (class) (gpunode_units{job=~"$job"})`."""
    s = strip_promql(expr)
    names = set()
    for m in IDENT_RE.finditer(s):
        word = m.group(1)
        if s[m.end():].lstrip().startswith("(") or word.lower() in KEYWORDS:
            continue  # a function, an aggregation or a keyword
        names.add(word)
    return names


def variable_query(query):
    """The PromQL in a Grafana variable's query: label_values(EXPR, LABEL) reads EXPR."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*", query, re.DOTALL)
    return m.group(1) if m else query


def rated_names(expr):
    """The metric names that rate(), irate() or increase() are applied to."""
    return {m.group(2) for m in RATE_RE.finditer(STRING_RE.sub('""', expr))}


def check_parser(c):
    """The name parser on cases whose answer is known, a bogus name among them."""
    cases = [
        ('sum by (class, reservable) (gpunode_units{job=~"$job", instance=~"$instance"})', {"gpunode_units"}),
        ('increase(gpunode_central_delivery_failures_total[15m]) > 0\n unless on (job, instance) '
         'changes(gpunode_central_acked_seq[15m]) > 0', {"gpunode_central_delivery_failures_total", "gpunode_central_acked_seq"}),
        ('histogram_quantile(0.99, sum by (le, route) (rate(gpunode_http_request_duration_seconds_bucket{x="a b(c)"}[$__rate_interval])))',
         {"gpunode_http_request_duration_seconds_bucket"}),
        ('sum(gpunode_units{reservable="true"}) < sum(gpunode_units offset 1h) * 1e0', {"gpunode_units"}),
        ('up{job="gpunode"} == 0 or absent(gpunode_bogus_metric)', {"up", "gpunode_bogus_metric"}),
        ('max without (version) (gpunode_build_info) + on (instance) group_left (x) gpunode_state_revision',
         {"gpunode_build_info", "gpunode_state_revision"}),
    ]
    for expr, want in cases:
        c.eq(f"parser: {expr.splitlines()[0][:70]} names {sorted(want)}", metric_names(expr), want)
    c.eq("parser: label_values(METRIC, LABEL) (Grafana's) reads METRIC",
         metric_names(variable_query('label_values(gpunode_build_info{job=~"$job"}, instance)')), {"gpunode_build_info"})
    c.eq("parser: rate/increase over", rated_names(cases[1][0] + " + " + cases[2][0]),
         {"gpunode_central_delivery_failures_total", "gpunode_http_request_duration_seconds_bucket"})


def promtool(c, args, want):
    tool = shutil.which("promtool")
    if not c.check("promtool is installed (Debian package prometheus; scripts/install-deps.sh)", tool, "not on PATH"):
        return
    r = subprocess.run([tool, *args], capture_output=True, text=True, timeout=120)
    out = (r.stdout + r.stderr).strip()
    print("\n".join(f"# {line}" for line in out.splitlines()), flush=True)
    c.check(f"promtool {' '.join(args[:2])} {os.path.basename(args[-1])}: exit 0, {want}",
            r.returncode == 0 and want in out, f"exit {r.returncode}: {out[-2000:]}")


def load_rules(c):
    with open(RULES, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    rules = [r for g in doc.get("groups", []) for r in g.get("rules", []) if "alert" in r]
    c.check(f"{len(rules)} alerting rules in gpunode-alerts.yaml", rules, doc)
    return rules


def check_rule_shapes(c, rules):
    names = {r["alert"]: r for r in rules}
    for alert, metric in REQUIRED.items():
        c.check(f"rule {alert} exists and reads {metric}", alert in names and metric in metric_names(names[alert]["expr"]),
                sorted(names))
    for r in rules:
        a, labels, notes = r["alert"], r.get("labels", {}), r.get("annotations", {})
        c.check(f"{a}: has for:", "for" in r, r)
        c.check(f"{a}: severity is one of {sorted(SEVERITIES)}", labels.get("severity") in SEVERITIES, labels)
        c.check(f"{a}: summary and description name the node ($labels.instance)",
                all("$labels.instance" in notes.get(k, "") for k in ("summary", "description")), notes)
        c.check(f"{a}: runbook points at the docs", f"docs/architecture.md#alerts-and-dashboard ({a})" in notes.get("runbook", ""),
                notes.get("runbook"))


def check_rule_tests(c, rules):
    """Each alert has a case that fires and one where it must not, in the promtool tests."""
    with open(RULE_TESTS, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    cases = [t for test in doc.get("tests", []) for t in test.get("alert_rule_test", [])]
    for r in rules:
        mine = [t for t in cases if t.get("alertname") == r["alert"]]
        c.check(f"{r['alert']}: a promtool case where it fires, with its labels and annotations",
                any(t.get("exp_alerts") and all(e.get("exp_annotations") for e in t["exp_alerts"]) for t in mine), mine)
        c.check(f"{r['alert']}: a promtool case where it must not fire", any(not t.get("exp_alerts") for t in mine), mine)


def exposed(lab):
    """What one scrape of the agent holds: {series name} and {family name: type}."""
    lab.get(lab.npath("/units"), unix=True)  # a request, for the HTTP counters and histogram
    samples, types = parse(lab.get("/metrics", unix=True).body.decode())
    return {name for name, _ in samples}, types


def family_of(name, types):
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix) and types.get(name[:-len(suffix)]) == "histogram":
            return name[:-len(suffix)]
    return name


def check_names(c, where, expr, series, types, allowed=frozenset()):
    """Every metric the expression reads is a series of the scrape; rate/increase over counters."""
    names = metric_names(expr)
    c.check(f"{where}: reads a metric", names, expr)
    for name in sorted(names):
        family = family_of(name, types)
        c.check(f"{where}: {name} is exposed by the agent" + (f" (histogram {family})" if family != name else "")
                + (" (Prometheus's own)" if name in allowed else ""),
                name in series or name in allowed, f"not in the scrape; expr: {expr}")
    for name in sorted(rated_names(expr)):
        c.check(f"{where}: rate/increase over {name}, a counter or a histogram's series",
                types.get(name) == "counter" or family_of(name, types) != name, types.get(name))
    return names


def check_dashboard(c, series, types):
    with open(DASHBOARD, encoding="utf-8") as f:
        text = f.read()
    try:
        dash = json.loads(text)
    except ValueError as e:
        c.check("gpunode.json is JSON", False, e)
        return
    c.check("gpunode.json is JSON", True)
    c.check("schemaVersion >= 37", isinstance(dash.get("schemaVersion"), int) and dash["schemaVersion"] >= 37,
            dash.get("schemaVersion"))
    c.check("a uid and a title", dash.get("uid") and dash.get("title"), (dash.get("uid"), dash.get("title")))
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource", {})
    c.check("a `datasource` variable of type datasource for prometheus",
            ds.get("type") == "datasource" and ds.get("query") == "prometheus", ds)
    node = variables.get("instance", {})
    c.check("an `instance` (node) variable, a query", node.get("type") == "query", node)
    used = set()
    for name, v in variables.items():
        if v.get("type") == "query":
            q = v.get("query")
            q = q.get("query", "") if isinstance(q, dict) else q or ""
            c.check(f"variable {name}: queries the dashboard's datasource",
                    (v.get("datasource") or {}).get("uid") == "${datasource}", v.get("datasource"))
            used |= check_names(c, f"variable {name}", variable_query(q), series, types)

    panels = []
    for p in dash.get("panels", []):
        panels.append(p)
        panels.extend(p.get("panels", []))  # a collapsed row's
    ids = [p.get("id") for p in panels]
    c.eq("panel ids are unique", len(ids), len(set(ids)))
    shown = [p for p in panels if p.get("type") != "row"]
    c.check(f"{len(shown)} panels besides rows", len(shown) >= 10, len(shown))
    for p in shown:
        where = f"panel {p.get('title')!r}"
        c.check(f"{where}: datasource is the `datasource` variable",
                (p.get("datasource") or {}).get("uid") == "${datasource}", p.get("datasource"))
        targets = p.get("targets") or []
        c.check(f"{where}: has targets", targets, p)
        for t in targets:
            c.check(f"{where} {t.get('refId')}: a refId, a prometheus datasource and an expr",
                    t.get("refId") and t.get("expr") and (t.get("datasource") or {}).get("type") == "prometheus", t)
            used |= check_names(c, f"{where} {t.get('refId')}", t.get("expr", ""), series, types)
    families = {family_of(n, types) for n in series}
    c.eq("every family the agent exposes is on a panel", sorted(families - {family_of(n, types) for n in used}), [])


def body(c, agent):
    check_parser(c)
    promtool(c, ["check", "rules", RULES], "SUCCESS")
    promtool(c, ["test", "rules", RULE_TESTS], "SUCCESS")
    rules = load_rules(c)
    check_rule_shapes(c, rules)
    check_rule_tests(c, rules)

    with L.Lab(agent) as lab:
        lab.start()
        series, types = exposed(lab)
        lab.stop()
    print(f"# the agent exposes {len(types)} families, {len(series)} series names: {', '.join(sorted(types))}", flush=True)
    c.check("the scrape holds the histogram's series", "gpunode_http_request_duration_seconds_bucket" in series, sorted(series))
    for r in rules:
        check_names(c, f"alert {r['alert']}", r["expr"], series, types, PROMETHEUS_SERIES)
    check_dashboard(c, series, types)


if __name__ == "__main__":
    sys.exit(L.run_main("alerts", body))
