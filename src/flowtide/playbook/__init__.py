"""The playbook DSL: load YAML with positions, validate into typed models, render templates."""

from flowtide.playbook.loader import load_playbook, parse_playbook
from flowtide.playbook.model import Arc, Loop, Next, Playbook, Policy, Rule, Step, Task

__all__ = [
    "Arc",
    "Loop",
    "Next",
    "Playbook",
    "Policy",
    "Rule",
    "Step",
    "Task",
    "load_playbook",
    "parse_playbook",
]
