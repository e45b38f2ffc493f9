"""Spark for `kind: spark` steps: one SparkSession per process, shared by every step.

Importing this package is cheap: pyspark is imported (and a JVM started, in classic
mode) only when the first spark step runs.

- `session`: which master and conf to use, and the process-wide session holder.
- `activity`: spark work in flight, by step (progress display, cancellation, job ids).
- `records`: inline records (lists of JSON objects) to DataFrames with a widened schema.
- `datasets`: inputs (records, references, sources), sinks and result references.
- `outputs`: a result reference's rows read back with DuckDB, without Spark
  (`flowtide data`).
"""
