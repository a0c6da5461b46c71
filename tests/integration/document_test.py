#!/usr/bin/env python3
"""docs/openapi.yaml as the ecosystem's tools read it (lab.py, document_rules): every rule holds
for the document, one check each, and each rule catches what it is there for (a copy of the
document broken the way the rule forbids fails it). The answers themselves are checked against
the document by every other integration test (lab.py, ApiDocument.check).

Stoplight Prism and Spectral read the document too: scripts/check-api-document.sh runs them
(Spectral's spectral:oas rules; Prism's validator over the integration tests' traffic). This
test needs only python3-yaml and python3-jsonschema.

    document_test.py [PATH/TO/gpunode-agent]   (the agent is not run; the argument is CTest's)"""
import copy
import sys

sys.dont_write_bytecode = True
import lab as L  # noqa: E402


def broken(doc, how):
    d = copy.deepcopy(doc)
    how(d)
    return L.document_rules(d)


def main():
    c = L.Checks("document")
    doc = L.api_document().doc
    rules = L.document_rules(doc)
    for rule, bad in rules.items():
        c.check(f"docs/openapi.yaml: {rule}", not bad, "; ".join(bad[:10]))

    # each rule bites: the document broken as the rule forbids
    def ref_with_siblings(d):
        s = d["components"]["schemas"]
        s["Reservation"] = {"$ref": "#/components/schemas/ReservationWithSpot", "unevaluatedProperties": False}
    r = broken(doc, ref_with_siblings)
    c.check("a $ref beside unevaluatedProperties (what Prism misread) fails two rules",
            r["no $ref has sibling keywords other than description and summary"] and
            r["no unevaluatedProperties or unevaluatedItems (closed objects list their own properties)"], r)

    def unused(d):
        d["components"]["headers"]["Unused"] = {"schema": {"type": "string"}}
    r = broken(doc, unused)
    c.eq("an unused component is found", r["every component is used (oas3-unused-component)"],
         ["components/headers/Unused"])

    def no_contact(d):
        del d["info"]["contact"]
    c.check("no info.contact is found",
            bool(broken(doc, no_contact)["info has a contact, a description and a license (info-contact, info-description)"]))

    def no_description(d):
        del d["paths"]["/v1/admin/rescan"]["post"]["description"]
        del d["webhooks"]["nodeHeartbeat"]["post"]["tags"]
    r = broken(doc, no_description)
    key = [k for k in r if k.startswith("every operation has")][0]
    c.eq("an operation without description, a webhook without tags are found", r[key],
         ["paths /v1/admin/rescan post: no description", "webhooks nodeHeartbeat post: no tags"])

    def open_object(d):
        del d["components"]["schemas"]["InternalProblem"]["additionalProperties"]
    r = broken(doc, open_object)
    c.check("an open object in an answer is found",
            any("InternalProblem" in x for x in r["every object an answer can hold is closed by additionalProperties: false"]), r)

    def drift(d):
        d["components"]["schemas"]["Reservation"]["properties"]["note"]["maxLength"] = 2048
    r = broken(doc, drift)
    c.check("ReservationWithSpot drifting from Reservation is found",
            bool(r["ReservationWithSpot is Reservation with spotWorkloads, key for key"]), r)

    def bad_example(d):
        d["components"]["schemas"]["UnitId"]["examples"] = ["u-0000:41:00.0"]
    r = broken(doc, bad_example)
    c.check("an example its schema refuses is found",
            bool(r["every schema's examples are valid against it (oas3-valid-schema-example)"]), r)

    def problem_without_title(d):
        p = d["components"]["schemas"]["InternalProblem"]
        p["required"].remove("title")
        del p["properties"]["title"]
        d["components"]["schemas"]["Problem"]["oneOf"].pop()
    r = broken(doc, problem_without_title)
    key = [k for k in r if k.startswith("every …Problem")][0]
    c.check("a problem without title, and one left out of Problem, are found", len(r[key]) == 3, r[key])

    # the document's components validate what they describe (a sample of each kind)
    problem = {"type": "urn:gpunode:problem:not-found", "title": "Not Found", "status": 404,
               "detail": "no such thing", "code": "not-found", "errors": []}
    d = L.api_document()
    c.eq("a not-found problem is a Problem", d.component_errors("Problem", problem), [])
    c.check("a problem with a key its code does not have is not",
            d.component_errors("Problem", dict(problem, extra=1)) != [])
    c.check("a problem without detail is not",
            d.component_errors("Problem", {k: v for k, v in problem.items() if k != "detail"}) != [])
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())
