"""The rehearse evaluators against Argo's own cases (when_test.go, util/template tests) and
the expressions in workflows/training.yaml."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from aegis_flow.argo.rehearse.exprlang import (
    ExprError,
    argo_env,
    evaluate,
    evaluate_bool,
    expand,
    retry_scope,
)
from aegis_flow.argo.rehearse.govaluate import WhenError, evaluate_when, go_value
from aegis_flow.argo.rehearse.tmpl import (
    TemplateError,
    is_missing_variable,
    substitute,
    substitute_json,
    unresolved,
)

# workflow/controller/when_test.go TestShouldExecute (v4.0.5)
ARGO_TRUE = ["foo == foo", "'ref/branch/master' == 'ref/branch/master'", "foo != bar", "1 == 1",
             "1 != 2", "1 < 2", "1 <= 1", "1/2 == 0.5", "a < b", "(foo == bar) || (foo == foo)",
             "(1 > 0) && (1 < 2)", "Error in (Failed, Error)", "!(Succeeded in (Failed, Error))",
             "true == true"]
ARGO_FALSE = ["foo != foo", "'ref/branch/master' != 'ref/branch/master'", "foo == bar", "1 != 1",
              "1 == 2", "1 > 2", "1 <= 0", "1/2 != 0.5", "a > b", "(foo == bar) || (bar == foo)",
              "(1 > 0) && (11 < 2)", "Succeeded in (Failed, Error)",
              "!(Error in (Failed, Error))", "false == true"]


@pytest.mark.parametrize("expr", ARGO_TRUE)
def test_when_argo_true(expr: str) -> None:
    assert evaluate_when(expr) is True


@pytest.mark.parametrize("expr", ARGO_FALSE)
def test_when_argo_false(expr: str) -> None:
    assert evaluate_when(expr) is False


@pytest.mark.parametrize(("expr", "expected"), [
    ("", True),
    ("heads == heads", True),  # coinflip: {{steps.flip-coin.outputs.result}} == heads
    ("tails == heads", False),
    ("'a' == 1", False),
    ("1 == 1.0", True),
    ("2 ** 3 ** 2 == 64", True),  # govaluate's mirror makes ** left-associative
    ("10 - 2 - 3 == 5", True),
    ("-2 ** 2 == 4", True),  # a prefix binds to one value
    ("1 + 2 * 3 == 7", True),
    ("'a' + 1 == 'a1'", True),
    ("'abc' =~ '^a'", True),
    ("'abc' !~ 'z'", True),
    ("true || a.B", True),  # short-circuit skips the failing accessor
    ("false && a.B", False),
    ("true ? false : true", False),
    ("'2020-01-01' < '2021-01-01'", True),
    ("0x10 == 16", True),
    ("(true) false", True),  # govaluate ignores tokens left after a complete group
])
def test_when_semantics(expr: str, expected: bool) -> None:
    assert evaluate_when(expr) is expected


@pytest.mark.parametrize(("expr", "message"), [
    ("1 +", "Invalid 'when' expression '1 +': Unexpected end of expression"),
    ("1 ==-1", "Invalid 'when' expression '1 ==-1': Invalid token: '==-' (hint: try wrapping "
               "the affected expression in quotes (\"))"),
    ("(1 == 1", "Invalid 'when' expression '(1 == 1': Unbalanced parenthesis"),
    ("'abc == x", "Invalid 'when' expression ''abc == x': Unclosed string literal"),
    ("foo(1)", "Invalid 'when' expression 'foo(1)': Undefined function foo"),
    ("1 2", "Invalid 'when' expression '1 2': Cannot transition token types from NUMERIC [1] "
            "to NUMERIC [2]"),
    ("== 1", "Invalid 'when' expression '== 1': Cannot transition token types from UNKNOWN "
             "[<nil>] to COMPARATOR [==]"),
    ("a.b == 1", "Invalid 'when' expression 'a.b == 1': Unable to access unexported field 'b' "
                 "in token 'a.b'"),
    ("1.2.3 == 1", "Invalid 'when' expression '1.2.3 == 1': Unable to parse numeric value "
                   "'1.2.3' to float64\n"),
    ("!foo", "Failed to parse 'when' expression '!foo': Cannot transition token types from "
             "PREFIX [!] to STRING [foo]"),
    ("'a' < 1", "Failed to evaluate 'when' expresion ''a' < 1': Value 'a' cannot be used with "
                "the comparator '<', it is not a number"),
    ("my-value == my-value", "Failed to evaluate 'when' expresion 'my-value == my-value': "
                             "Value 'my' cannot be used with the modifier '-', it is not a "
                             "number"),
    ("a.B == 1", "Failed to evaluate 'when' expresion 'a.B == 1': No parameter 'a' found."),
    ("Error in (Failed)", "Failed to evaluate 'when' expresion 'Error in (Failed)': Value "
                          "'Failed' cannot be used with the comparator 'in', it is not a number"),
    ("1 && true", "Failed to evaluate 'when' expresion '1 && true': Value '1' cannot be used "
                  "with the logical operator '&&', it is not a bool"),
    ("1 + 1", "Expected boolean evaluation for '1 + 1'. Got 2"),
    ("1000000 + 0", "Expected boolean evaluation for '1000000 + 0'. Got 1e+06"),
    ("foo", "Expected boolean evaluation for 'foo'. Got foo"),
    ("a, b", "Expected boolean evaluation for 'a, b'. Got [a b]"),
])
def test_when_errors(expr: str, message: str) -> None:
    with pytest.raises(WhenError) as err:
        evaluate_when(expr)
    assert str(err.value) == message


def test_go_value_formats_floats_like_fmt() -> None:
    assert [go_value(v) for v in (1.0, 0.5, 123456.0, 1e6, 1e-5, 0.0001, -2.5e21)] == [
        "1", "0.5", "123456", "1e+06", "1e-05", "0.0001", "-2.5e+21"]


# ------------------------------------------------------------------------------ exprlang

def _retry_env(exit_code: str | None, phase: str = "Failed") -> dict[str, object]:
    return argo_env(retry_scope(attempts=2, exit_code=exit_code, phase=phase, duration_s=3.5,
                                message="boom"))


def _training_retry_expressions() -> list[str]:
    root = Path(__file__).resolve().parents[1]
    found: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            strategy = node.get("retryStrategy")
            if isinstance(strategy, dict) and "expression" in strategy:
                found.append(str(strategy["expression"]))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    for doc in yaml.safe_load_all((root / "workflows" / "training.yaml").read_text()):
        walk(doc)
    return found


def test_training_yaml_retry_expressions_compile_and_decide() -> None:
    exprs = _training_retry_expressions()
    assert exprs, "training.yaml has retryStrategy.expression entries"
    for expr in exprs:
        assert evaluate_bool(expr, _retry_env("0", phase="Error")) is True
        assert isinstance(evaluate_bool(expr, _retry_env("1")), bool)


@pytest.mark.parametrize(("exit_code", "phase", "expected"), [
    ("70", "Failed", True), ("71", "Failed", True), ("1", "Failed", False),
    (None, "Error", True), ("0", "Failed", False),
])
def test_retry_on_70_71(exit_code: str | None, phase: str, expected: bool) -> None:
    expr = ('lastRetry.status == "Error" || asInt(lastRetry.exitCode) == 70 || '
            'asInt(lastRetry.exitCode) == 71')
    assert evaluate_bool(expr, _retry_env(exit_code, phase)) is expected


@pytest.mark.parametrize(("exit_code", "expected"), [
    ("0", False), ("73", False), ("74", False), ("1", True), ("137", True)])
def test_retry_except_73_74(exit_code: str, expected: bool) -> None:
    expr = ('lastRetry.status == "Error" || (asInt(lastRetry.exitCode) != 0 && '
            'asInt(lastRetry.exitCode) != 73 && asInt(lastRetry.exitCode) != 74)')
    assert evaluate_bool(expr, _retry_env(exit_code)) is expected


def test_retry_scope_is_all_strings() -> None:
    assert retry_scope(attempts=3, exit_code=None, phase="Failed", duration_s=2.0,
                       message="m") == {"retries": "2", "lastRetry.exitCode": "-1",
                                        "lastRetry.status": "Failed",
                                        "lastRetry.duration": "2", "lastRetry.message": "m"}


@pytest.mark.parametrize(("expr", "expected"), [
    ("lastRetry.exitCode == 70", False),  # "70" is a string: no error, just false
    ('lastRetry.exitCode == "70"', True),
    ("asInt(lastRetry.exitCode) == 70", True),
    ("int(lastRetry.exitCode) > 69", True),
    ("asFloat(lastRetry.duration) == 3.5", True),
    ("asInt(retries) < 3", True),
    ("1 < 2 < 3", True),
    ("not (70 in [1, 2])", True),
    ("'a' not in ['b']", True),
    ("lastRetry.message matches 'b.+m' and lastRetry.message startsWith 'bo'", True),
    ("lastRetry.message contains 'oo' && lastRetry.message endsWith 'm'", True),
    ("string(asInt(lastRetry.exitCode)) == '70'", True),
    ("len(lastRetry.message) == 4", True),
    ("lastRetry.nothing == nil", True),
    ("lastRetry.nothing ?? 'x'", "x"),
    ("7 / 2", 3.5),
    ("7 % 3", 1),
    ("2 ** 3 ** 2", 512.0),  # expr's ** is right-associative (govaluate's is not)
    ("true ? 'a' : 'b'", "a"),
    ("toJson(['a', 1])", '["a",1]'),
])
def test_expr_semantics(expr: str, expected: object) -> None:
    assert evaluate(expr, _retry_env("70")) == expected


@pytest.mark.parametrize(("expr", "message"), [
    ("retries < 3", "invalid operation: < (mismatched types string and int) (1:9)\n"
                    " | retries < 3\n | ........^"),
    ("foo == 1", "unknown name foo (1:1)\n | foo == 1\n | ^"),
    ("int(true)", "invalid argument for int (type bool) (1:1)\n | int(true)\n | ^"),
    ("asInt(1, 2)", "too many arguments to call asInt (1:1)\n | asInt(1, 2)\n | ^"),
    ("1 +", "unexpected token EOF (1:4)\n | 1 +\n | ...^"),
    ("1 + 'a'", "invalid operation: + (mismatched types int and string) (1:3)\n"
                " | 1 + 'a'\n | ..^"),
])
def test_expr_compile_errors(expr: str, message: str) -> None:
    with pytest.raises(ExprError) as err:
        evaluate_bool(expr, _retry_env("70"))
    assert str(err.value) == message


def test_expr_run_errors_are_wrapped_like_eval_bool() -> None:
    with pytest.raises(ExprError) as err:
        evaluate_bool("asInt(lastRetry.message) == 1", _retry_env("70"))
    assert str(err.value).startswith("unable to evaluate expression 'asInt(lastRetry.message) "
                                     "== 1': invalid operation: int(boom) (1:1)")
    with pytest.raises(ExprError, match="invalid operation: string < int"):
        evaluate_bool("lastRetry.exitCode < 3", _retry_env("70"))
    with pytest.raises(ExprError) as err:
        evaluate_bool("asInt(lastRetry.exitCode)", _retry_env("70"))
    assert str(err.value) == "unable to cast expression result '%!s(int=70)' to bool"


def test_expand_nests_and_drops_shadowed_parents() -> None:
    assert expand({"a": "1", "a.b": "2", "c.d.e": "3"}) == {"a": {"b": "2"},
                                                            "c": {"d": {"e": "3"}}}


# -------------------------------------------------------------------------------- tmpl

SCOPE = {"steps.verdict.outputs.parameters.verdict": "quarantine",
         "inputs.parameters.attempt": "1", "workflow.parameters.max-retry": "3",
         "inputs.parameters.message": 'say "hi"\n', "b": "B"}


def test_training_when_guards_resolve_and_decide() -> None:
    when = ("('{{steps.verdict.outputs.parameters.verdict}}' == 'quarantine' || "
            "'{{steps.verdict.outputs.parameters.verdict}}' == 'retry') && "
            "{{inputs.parameters.attempt}} < {{workflow.parameters.max-retry}}")
    resolved = substitute(when, SCOPE, allow_unresolved=True, strict_prefixes=("steps", "tasks"))
    assert resolved == "('quarantine' == 'quarantine' || 'quarantine' == 'retry') && 1 < 3"
    assert evaluate_when(resolved) is True


def test_tag_whitespace_is_trimmed_and_values_round_trip() -> None:
    assert substitute("{{ inputs.parameters.message }}!", SCOPE,
                      allow_unresolved=False) == 'say "hi"\n!'


def test_allow_unresolved_keeps_tags_verbatim() -> None:
    text = "{{ nope }} {{=item}}"
    assert substitute(text, SCOPE, allow_unresolved=True) == text


@pytest.mark.parametrize(("text", "kwargs", "message"), [
    ("{{nope}}", {"allow_unresolved": False}, "failed to resolve {{nope}}"),
    ("{{ nope }}", {"allow_unresolved": False}, "failed to resolve {{ nope }}"),
    ("{{steps.a.outputs.result}}", {"allow_unresolved": True, "strict_prefixes": ("steps",)},
     "failed to resolve {{steps.a.outputs.result}}"),
    ("{{=steps.a.outputs.result == 'x'}}", {"allow_unresolved": True,
                                            "strict_prefixes": ("steps",)},
     # ast.Walk is post-order: the shortest missing prefix is reported
     "failed to evaluate expression: steps.a is missing"),
    ("{{x", {"allow_unresolved": True},
     'Cannot find end tag="}}" in the template="\\"{{x\\"" starting from "x\\""'),
])
def test_unresolved_errors(text: str, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(TemplateError) as err:
        substitute(text, SCOPE, **kwargs)  # type: ignore[arg-type]
    assert str(err.value) == message


def test_strict_prefixes_spare_other_tags_and_artifacts() -> None:
    kwargs = {"allow_unresolved": True, "strict_prefixes": ("steps", "tasks")}
    text = "{{workflow.x}} {{steps.a.outputs.artifacts.out}} {{stepsX}}"
    assert substitute(text, SCOPE, **kwargs) == text  # type: ignore[arg-type]
    with pytest.raises(TemplateError) as err:
        substitute("{{tasks.a.ip}}", SCOPE, **kwargs)  # type: ignore[arg-type]
    assert is_missing_variable(err.value)


def test_expression_tags() -> None:
    assert substitute("{{=asInt(inputs.parameters.attempt) + 1}}", SCOPE,
                      allow_unresolved=False) == "2"
    assert substitute("{{=inputs.parameters.attempt}}", SCOPE, allow_unresolved=False) == "1"
    assert substitute("{{=toJson([1, 'a'])}}", SCOPE, allow_unresolved=False) == '[1,"a"]'
    assert substitute("{{='<' + \"&\"}}", SCOPE, allow_unresolved=False) == "<&"
    with pytest.raises(TemplateError, match="invalid operation: string \\+ int"):
        substitute("{{=inputs.parameters.attempt + 1}}", SCOPE, allow_unresolved=False)


def test_nested_tag_resolves_inner() -> None:  # simple_template.go nested-tag branch
    assert substitute("{{a{{b}}}}", SCOPE, allow_unresolved=True) == "{{aB}}"


def test_substitute_json_escapes_values() -> None:
    obj = {"args": ["echo", "{{inputs.parameters.message}}"], "n": 1}
    assert substitute_json(obj, SCOPE, allow_unresolved=False) == {
        "args": ["echo", 'say "hi"\n'], "n": 1}


def test_go_only_escapes_break_the_json() -> None:
    with pytest.raises(TemplateError) as err:
        substitute("{{v}}", {"v": "bell\a"}, allow_unresolved=False)
    assert str(err.value) == ("cannot finish template replacement because the result was "
                              "invalid JSON")


def test_unresolved_lists_tags() -> None:
    assert unresolved("{{ a }} x {{=b + 1}} {{a}}") == ["a", "=b + 1"]
    assert unresolved("no tags") == []
