"""`kind: upper` — an example flowtide tool plugin.

This module is what the `flowtide.tools` entry point names: it declares the kind (its
fields, a check, its result) and stays light, because `flowtide validate` imports it.
The runner is named by reference ("module:Class"): its module is imported only when a
task of the kind first runs, the place for a plugin's heavy imports (a driver, an SDK).

    - step: shout
      tool:
        kind: upper
        text: "{{ workload.greeting }}"
        case: title        # upper (default) | lower | title
        repeat: 2          # 1..10
"""

from __future__ import annotations

from flowtide import FieldSpec, TaskCheck, ToolSpec

MAX_REPEAT = 10


def check(task: TaskCheck) -> None:
    """What the field schema cannot say: `repeat` is between 1 and MAX_REPEAT."""
    repeat = task.config.get("repeat")
    if isinstance(repeat, int) and not 1 <= repeat <= MAX_REPEAT:
        task.error(
            task.at("repeat"),
            f"upper 'repeat' must be between 1 and {MAX_REPEAT}, not {repeat}",
            expected=f"1..{MAX_REPEAT}",
        )


SPEC = ToolSpec(
    "upper",
    "flowtide_upper.runner:UpperTool",
    requires=("text",),
    fields={
        "text": FieldSpec(types=(str,), doc="the text (a template is rendered first)"),
        "case": FieldSpec(types=(str,), choices=("upper", "lower", "title")),
        "repeat": FieldSpec(types=(int,), doc=f"how many times, 1..{MAX_REPEAT}"),
    },
    strict=True,
    check=check,
    result="{text, length}",
    doc="changes the case of a text",
)
