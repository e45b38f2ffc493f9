"""A spark step's preview rows follow the JSON rules every tool's results follow (README,
"Results as JSON"): the same values give the same JSON as from a python step, through
the whole runtime (pipeline, event store, execution document)."""

from __future__ import annotations

from jsonsample import EXPECTED, PYTHON_CODE, UID, canonical

from .conftest import Runner

# Spark has no TIME, TIMESTAMP WITH TIME ZONE that keeps its offset, interval columns
# in parquet or UUID type: those columns are left out (uid comes as its text).
SPARK_COLUMNS = [k for k in EXPECTED if k not in ("at", "clock", "clock_tz", "span")]


def test_spark_preview_and_python_give_the_same_json(run_playbook: Runner) -> None:
    code = "\n".join(" " * 16 + line for line in PYTHON_CODE.splitlines())
    result = run_playbook(
        f"""\
        workflow:
          - step: start
            tool:
              kind: spark
              sql: >-
                SELECT CAST(600 AS DECIMAL(10, 0)) AS whole,
                       CAST(12.50 AS DECIMAL(10, 2)) AS price,
                       CAST('NaN' AS DOUBLE) AS nan, CAST('Infinity' AS DOUBLE) AS inf,
                       X'00FF' AS raw, CAST('ab' AS BINARY) AS text_bytes,
                       TIMESTAMP_NTZ '2024-05-06 07:08:09' AS naive, DATE '2024-05-06' AS day,
                       '{UID}' AS uid, array(1, 2) AS list, named_struct('k', 'v') AS obj,
                       CAST(NULL AS STRING) AS nothing, true AS flag, 42 AS n, 'text' AS s
            next: [python]
          - step: python
            tool:
              kind: python
              code: |
{code}
        """
    )
    assert result.doc["status"] == "completed", result.doc["error"]
    preview = result.step("start")["result"]["preview"]
    assert canonical(preview) == canonical([{k: EXPECTED[k] for k in SPARK_COLUMNS}])
    assert canonical(result.step("python")["result"]) == canonical([EXPECTED])
