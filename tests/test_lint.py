"""Offline validation: one planted error per lint rule, and a planted schema typo."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from aegis_flow.argo import lint, validate_schema
from aegis_flow.argo.lint import references
from aegis_flow.jobspec import JobSpec
from aegis_flow.workflow import build_checks_template, render
from tests.argo_schema import needs_schema

Doc = dict[str, Any]
GOOD = render(JobSpec(image="img:1", command=("python", "train.py"), workers=2))
CHECKS = build_checks_template(image="aegis:1").to_dict()


def tmpl(doc: Doc, name: str) -> Doc:
    return next(t for t in doc["spec"]["templates"] if t["name"] == name)


def step(doc: Doc, template: str, name: str) -> Doc:
    return next(s for g in tmpl(doc, template)["steps"] for s in g if s["name"] == name)


def pipeline() -> Doc:
    return {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow",
            "metadata": {"generateName": "p-"},
            "spec": {"entrypoint": "dag", "templates": [
                {"name": "dag", "dag": {"tasks": [
                    {"name": "check", "templateRef": {"name": "aegis-checks",
                                                      "template": "check-gpu"}},
                    {"name": "train", "template": "train", "dependencies": ["check"],
                     "arguments": {"parameters": [{
                         "name": "r", "value": "{{tasks.check.outputs.parameters.result}}"}]}},
                ]}},
                {"name": "train", "inputs": {"parameters": [{"name": "r"}]},
                 "container": {"image": "i", "args": ["{{inputs.parameters.r}}"]}}]}}


def test_the_good_documents_are_clean() -> None:
    assert lint([GOOD]) == [] and lint([pipeline(), CHECKS]) == []


PLANTS: list[tuple[str, Callable[[Doc], None]]] = [
    ("entrypoint", lambda d: d["spec"].update(entrypoint="mian")),
    ("entrypoint", lambda d: d["spec"].update(onExit="reprot")),
    ("template-ref", lambda d: step(d, "main", "run").update(template="wroker")),
    ("input-param", lambda d: tmpl(d, "worker")["container"]["command"].append(
        "{{inputs.parameters.rnak}}")),
    ("input-param", lambda d: tmpl(d, "worker")["container"]["command"].append(
        "{{= inputs.parameters['nats-ulr'] }}")),
    ("workflow-param", lambda d: tmpl(d, "master")["container"]["args"].append(
        "{{workflow.parameters.max-retries}}")),
    ("step-ref", lambda d: step(d, "main", "give-up").update(
        when="'{{steps.mastr.outputs.parameters.verdict}}' == 'failed'")),
    ("step-ref", lambda d: step(d, "main", "give-up")["arguments"]["parameters"][0].update(
        value="{{tasks.master.outputs.parameters.verdict}}")),
    ("output-param", lambda d: step(d, "main", "give-up")["arguments"]["parameters"][0]
        .update(value="{{steps.master.outputs.parameters.verdikt}}")),
    ("loop-item", lambda d: step(d, "main", "give-up")["arguments"]["parameters"][1]
        .update(value="{{item}}")),
    ("name", lambda d: d["spec"]["templates"].append({"name": "Extra_Step", "suspend": {}})),
    ("name", lambda d: step(d, "main", "give-up").update(name="give.up")),
    ("unique", lambda d: d["spec"]["templates"].append(copy.deepcopy(tmpl(d, "report")))),
    ("unique", lambda d: step(d, "main", "give-up").update(name="quarantine")),
    ("unique", lambda d: tmpl(d, "worker")["inputs"]["parameters"].append({"name": "rank"})),
    ("recursion", lambda d: d["spec"]["templates"][0]["steps"].append(
        [{"name": "again", "template": "main"}])),
]


@pytest.mark.parametrize(("rule", "plant"), PLANTS,
                         ids=[f"{r}-{i}" for i, (r, _) in enumerate(PLANTS)])
def test_each_rule_catches_a_planted_error(rule: str, plant: Callable[[Doc], None]) -> None:
    doc = copy.deepcopy(GOOD)
    plant(doc)
    found = lint([doc])
    assert found, f"{rule} not caught"
    assert {f.rule for f in found} == {rule}, [str(f) for f in found]


@pytest.mark.parametrize(("plant", "says"), [
    (lambda d: d["spec"]["templates"][0]["steps"][0][0]["templateRef"].update(
        template="check-gpuu"), "has no template 'check-gpuu'"),
    (lambda d: d["spec"]["templates"][0]["steps"][0][0]["templateRef"].update(
        name="other-checks"), "not among the linted files"),
    (lambda d: d["spec"]["templates"][0]["steps"][1][0].update(dependencies=["chek"]),
     "dependency 'chek'"),
])
def test_template_refs_and_dependencies(plant: Callable[[Doc], None], says: str) -> None:
    doc = pipeline()
    dag = doc["spec"]["templates"][0]
    dag["steps"] = [[dag["dag"]["tasks"][0]], [dag["dag"]["tasks"][1]]]
    del dag["dag"]
    dag["steps"][1][0]["arguments"]["parameters"][0]["value"] = \
        "{{steps.check.outputs.parameters.result}}"
    assert lint([doc, CHECKS]) == []
    plant(doc)
    found = lint([doc, CHECKS])
    assert found and says in str(found[0]), [str(f) for f in found]


def test_a_templateref_output_is_checked_against_the_referenced_template() -> None:
    doc = pipeline()
    doc["spec"]["templates"][0]["dag"]["tasks"][1]["arguments"]["parameters"][0]["value"] = \
        "{{tasks.check.outputs.parameters.results}}"
    assert [f.rule for f in lint([doc, CHECKS])] == ["output-param"]


def test_references_parser() -> None:
    assert list(references("a {{inputs.parameters.x}} {{steps.s.outputs.result}} "
                           "{{workflow.name}} {{=asInt(inputs.parameters['y-z']) + 1}}")) == [
        ("inputs", "x", ""), ("steps", "s", "outputs.result"), ("inputs", "y-z", "")]


@needs_schema
def test_schema_catches_a_planted_typo() -> None:
    doc = copy.deepcopy(GOOD)
    tmpl(doc, "worker")["retryStrategy"]["expresion"] = "true"
    errors = validate_schema(doc)
    assert len(errors) == 1
    assert "expresion" in errors[0].message and "retryStrategy" in errors[0].where


@needs_schema
def test_schema_catches_a_wrong_type_and_accepts_int_or_string() -> None:
    doc = copy.deepcopy(GOOD)
    tmpl(doc, "worker")["retryStrategy"]["limit"] = 3  # IntOrString: an int is fine
    assert validate_schema(doc) == []
    doc["spec"]["activeDeadlineSeconds"] = "a week"
    assert [e.where for e in validate_schema(doc)] == ["spec.activeDeadlineSeconds"]


def test_schema_rejects_an_unknown_kind() -> None:
    assert "not one of" in validate_schema({"kind": "Pod"})[0].message
