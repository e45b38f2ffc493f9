"""A parent playbook whose one step runs a slow sub-playbook (the cancel tests of both
runtimes). Register SLOW_CHILD in the catalog, then run PARENT."""

SLOW_CHILD = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: slow_child, path: tests/slow_child}
workflow:
  - step: work
    loop:
      in: "{{ range(200) | list }}"
      iterator: item
      spec: {mode: sequential}
    tool:
      kind: python
      code: |
        import time
        time.sleep(0.05)
        result = {"ok": True}
"""

PARENT = """
apiVersion: noetl.io/v2
kind: Playbook
metadata: {name: parent, path: tests/parent}
workflow:
  - step: call
    tool: {kind: playbook, path: tests/slow_child}
"""
