"""Policies: a task's `spec.policy.rules` (and the older tool-level `retry:` block,
translated into rules) and a step's `spec.policy`, which takes only `admit`.

Each rule becomes a `Rule` of the model; unknown actions, a `jump` without `to` and
rules written where they would never run are errors.
"""

from __future__ import annotations

import re
from typing import Any, Final

from flowtide.playbook.loader.checker import _Checker, _suggest
from flowtide.playbook.model import ACTIONS, Policy, Rule
from flowtide.playbook.source import Path as NodePath

#: An error kind `retry: {on: [...]}` may name.
_KIND: Final = re.compile(r"[a-z][a-z0-9_]{0,63}", re.ASCII)


def _as_float(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _parse_then(then: dict[str, Any], when: Any, is_else: bool) -> Rule:
    return Rule(
        when=when,
        is_else=is_else,
        do=str(then.get("do", "continue")),
        attempts=int(then.get("attempts", then.get("max_attempts", 3)) or 1),
        backoff=str(then.get("backoff", "fixed")),
        delay=_as_float(then.get("delay", then.get("backoff_seconds", 0.0)), 0.0),
        max_delay=_as_float(then.get("max_delay", 60.0), 60.0),
        to=then.get("to"),
        set=dict(then.get("set") or {}),
    )


def _parse_policy(c: _Checker, raw: Any, path: NodePath, step: str) -> Policy | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        c.error(
            path,
            "policy must be a mapping",
            step=step,
            field="spec.policy",
            expected="{rules: [...]}",
        )
        return None
    c.keys(raw, "policy", path, step, "spec.policy")
    rules_raw = raw.get("rules") or []
    if not isinstance(rules_raw, list):
        c.error(
            (*path, "rules"), "policy rules must be a list", step=step, field="spec.policy.rules"
        )
        return None
    rules: list[Rule] = []
    for i, item in enumerate(rules_raw):
        rpath = (*path, "rules", i)
        if not isinstance(item, dict):
            c.error(
                rpath,
                "a policy rule must be a mapping",
                step=step,
                field=f"spec.policy.rules[{i}]",
                expected="{when: ..., then: {do: ...}} or {else: {then: {...}}}",
            )
            continue
        c.keys(item, "policy rule", rpath, step, f"spec.policy.rules[{i}]")
        if "else" in item:
            body = item["else"] or {}
            # Both `else: {then: {...}}` and the then-less `else: {do: ..., set: ...}` occur in
            # real playbooks; NoETL's engines ignore the latter, we honour it.
            then = body.get("then", body) if isinstance(body, dict) else {}
            field = f"spec.policy.rules[{i}].else"
            if isinstance(body, dict):
                c.keys(body, "then", (*rpath, "else"), step, field)
            if isinstance(body, dict) and isinstance(body.get("then"), dict):
                c.keys(body["then"], "then", (*rpath, "else", "then"), step, f"{field}.then")
            rule = _parse_then(then or {}, None, True)
            tpath: NodePath = (*rpath, "else")
        else:
            if "when" not in item:
                c.error(
                    rpath,
                    "policy rule needs 'when' (or 'else')",
                    step=step,
                    field=f"spec.policy.rules[{i}]",
                )
                continue
            then = item.get("then") or {}
            if not isinstance(then, dict):
                c.error(
                    (*rpath, "then"),
                    "'then' must be a mapping",
                    step=step,
                    field=f"spec.policy.rules[{i}].then",
                    expected="{do: continue|retry|jump|break|fail}",
                )
                continue
            c.keys(then, "then", (*rpath, "then"), step, f"spec.policy.rules[{i}].then")
            rule = _parse_then(then, item["when"], False)
            tpath = (*rpath, "then")
            c.templates(item["when"], (*rpath, "when"), step, f"spec.policy.rules[{i}].when")
        if rule.do not in ACTIONS:
            c.error(
                (*tpath, "do"),
                f"unknown policy action '{rule.do}'{_suggest(rule.do, ACTIONS)}",
                step=step,
                field=f"spec.policy.rules[{i}].then.do",
                expected=" | ".join(ACTIONS),
            )
        if rule.do == "jump" and not rule.to:
            c.error(
                tpath,
                "'do: jump' needs 'to' (a task or step name)",
                step=step,
                field=f"spec.policy.rules[{i}].then.to",
            )
        rules.append(rule)
    return Policy(tuple(rules))


def _retry_rule(c: _Checker, raw: Any, path: NodePath, step: str, label: str) -> Policy | None:
    """A tool's `retry:` shorthand as the policy rule it stands for:

        retry: {attempts: 3, backoff: 2s, max_backoff: 1m, on: [timeout, server_error]}

    is `spec.policy.rules: [{when: "{{ output.status == 'error' and output.error.kind in
    [...] }}", then: {do: retry, attempts: 3, backoff: exponential, delay: 2, max_delay:
    60}}]` (without `on`: errors that say they are retryable). `retry: 3` is `{attempts:
    3}`; the older form (`max_attempts`, `retry_on`, `retry_on_status`, `backoff_seconds`,
    `backoff_multiplier`) is read as it always was."""
    from flowtide.errors import TriggerError
    from flowtide.triggers.when import parse_duration

    field = f"{label}.retry"
    if raw in (None, False):
        return None
    if raw is True:
        raw = {}
    if isinstance(raw, int):
        raw = {"attempts": raw}
    if not isinstance(raw, dict):
        c.error(path, "'retry' must be a mapping or a number of attempts", step=step, field=field)
        return None
    c.keys(raw, "retry", path, step, field)

    def seconds(key: str, default: float) -> float:
        value = raw.get(key)
        if value is None:
            return default
        try:
            return parse_duration(value, field=f"{field}.{key}", allow_zero=True)
        except TriggerError as exc:
            c.error(
                (*path, key),
                exc.message,
                step=step,
                field=f"{field}.{key}",
                expected="a duration like 500ms, 2s or 1m",
            )
            return default

    attempts = raw.get("attempts", raw.get("max_attempts", 3))
    if isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 100:
        c.error(
            (*path, "attempts"),
            "'attempts' must be a whole number from 1 to 100",
            step=step,
            field=f"{field}.attempts",
        )
        attempts = 3
    # `on` and `retry_on_status` become part of the rule's template text: only error
    # kinds (identifiers) and HTTP statuses (integers) get there, never free text.
    kinds = raw.get("on", raw.get("retry_on"))
    if kinds is not None and (
        not isinstance(kinds, list)
        or not all(isinstance(k, str) and _KIND.fullmatch(k) for k in kinds)
    ):
        c.error(
            (*path, "on"),
            "'on' must be a list of error kinds (lower-case names like server_error)",
            step=step,
            field=f"{field}.on",
            expected="[timeout, server_error, rate_limited]",
        )
        kinds = None
    statuses = raw.get("retry_on_status")
    if statuses is not None and (
        not isinstance(statuses, list)
        or not all(
            isinstance(s, int) and not isinstance(s, bool) and 100 <= s <= 599 for s in statuses
        )
    ):
        c.error(
            (*path, "retry_on_status"),
            "'retry_on_status' must be a list of HTTP statuses (100 to 599)",
            step=step,
            field=f"{field}.retry_on_status",
            expected="[429, 503]",
        )
        statuses = None
    cond = "output.status == 'error'"
    if statuses:
        cond += f" and (output.error.http_status in {list(statuses)!r})"
    elif kinds:
        cond += f" and (output.error.kind in {list(kinds)!r})"
    else:
        cond += " and output.error.retryable"
    legacy = any(k in raw for k in ("backoff_seconds", "initial_delay", "backoff_multiplier"))
    if legacy:
        delay = seconds("backoff_seconds" if "backoff_seconds" in raw else "initial_delay", 1.0)
        backoff = "exponential" if raw.get("backoff_multiplier") else "fixed"
    else:
        delay = seconds("backoff", 1.0)
        backoff = "exponential"
    retry = Rule(
        when="{{ " + cond + " }}",
        is_else=False,
        do="retry",
        attempts=attempts,
        backoff=backoff,
        delay=delay,
        max_delay=seconds("max_backoff", 60.0),
    )
    return Policy((retry,))


# NoETL's step policy (`StepPolicy` in noetl/core/dsl/engine/models/workflow.py) has
# `admit`, `lifecycle`, `failure` and `emit`, and says it "MUST NOT include task control
# actions (those are task-level only)"; its validator checks `admit` alone, so `rules`
# written on the step are silently dropped there. flowtide runs `admit` and refuses the
# rest, naming where rules belong, instead of ignoring them.
# Its keys are `flowtide.playbook.loader.schema.STEP_POLICY`.


def _check_step_policy(c: _Checker, policy: Any, path: NodePath, step: str) -> None:
    ppath: NodePath = (*path, "spec", "policy")
    if not isinstance(policy, dict):
        c.error(
            ppath,
            "a step's 'spec.policy' must be a mapping",
            step=step,
            field="spec.policy",
            expected="{admit: {rules: [...]}}",
        )
        return
    c.keys(policy, "step policy", ppath, step, "spec.policy")


def _parse_admit(
    c: _Checker, raw: dict[str, Any], path: NodePath, step: str
) -> tuple[tuple[Any, bool], ...]:
    spec = raw.get("spec")
    policy = spec.get("policy") if isinstance(spec, dict) else None
    if policy is not None:
        _check_step_policy(c, policy, path, step)
    admit = policy.get("admit") if isinstance(policy, dict) else None
    if admit is None:
        return ()
    apath: NodePath = (*path, "spec", "policy", "admit")
    if isinstance(admit, dict):
        c.keys(admit, "admit", apath, step, "spec.policy.admit")
    rules = admit.get("rules") if isinstance(admit, dict) else None
    if not isinstance(rules, list):
        c.error(
            apath,
            "admit needs a list of 'rules'",
            step=step,
            field="spec.policy.admit.rules",
            expected="[{when: ..., then: {allow: true|false}}, {else: {then: {allow: ...}}}]",
        )
        return ()
    out: list[tuple[Any, bool]] = []
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        rpath: NodePath = (*apath, "rules", i)
        where = f"spec.policy.admit.rules[{i}]"
        c.keys(rule, "admit rule", rpath, step, where)
        for sub, at in (("then", (*rpath, "then")), ("else", (*rpath, "else"))):
            part = rule.get(sub)
            if isinstance(part, dict):
                c.keys(part, "admit then", at, step, f"{where}.{sub}", also=("then",))
                if isinstance(part.get("then"), dict):
                    c.keys(part["then"], "admit then", (*at, "then"), step, f"{where}.{sub}.then")
        body = rule.get("else") if "else" in rule else rule
        then = (body or {}).get("then", body) if isinstance(body, dict) else {}
        allow = then.get("allow", True) if isinstance(then, dict) else True
        when = None if "else" in rule else rule.get("when", True)
        c.templates(when, (*apath, "rules", i, "when"), step, f"spec.policy.admit.rules[{i}].when")
        out.append((when, bool(allow)))
    return tuple(out)
