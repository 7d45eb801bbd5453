"""The SQL engines of ``msmemscope ranks``: ``sql/ranks.sql`` on DuckDB or Spark.

Run by the command as ``python -m msmemscope.ranks_sql`` with a JSON request on stdin::

    {"engine": "duckdb" | "spark", "threshold_pct": 25,
     "dumps": [{"rank": 0, "run": "...", "device": "cpu", "dump": "memscope_dump_...",
                "parquet": "/path/memscope_dump_....parquet",
                "parts": ["/path/memscope_dump_....steps/step_..._000.parquet", ...]}, ...]}

``parts`` (optional) are the step parts a run longer than its dump budget kept beside the dump.

It prints the table's rows as a JSON list on stdout, with the fields of the native engine's
rows. Both engines read the same Parquet files into the view ``dump`` (the dump columns under
plain names, plus the file's rank, run, device and dump) and run the same SQL text.

Spark runs ``local[*]`` unless a master is configured the usual Spark ways (``spark.master``
in ``spark-defaults.conf``, ``PYSPARK_SUBMIT_ARGS``, or ``MSMEMSCOPE_SPARK_MASTER``).
"""

from __future__ import annotations

import json
import os
import sys
import urllib.parse
from pathlib import Path
from typing import Any

SQL_FILE = Path(__file__).with_name("sql") / "ranks.sql"

# The dump's Parquet columns the SQL reads, under the names it uses.
COLUMNS = [
    ("ID", "id"),
    ("Event", "event"),
    ("Event Type", "event_type"),
    ("Name", "name"),
    ("Device Id", "device_id"),
    ("Ptr", "ptr"),
    ("Attr", "attr"),
    ("Call Stack(Python)", "python_stack"),
    ("size", "size"),
    ("allocation_id", "allocation_id"),
    ("owner", "owner"),
    ("used", "used"),
    ("total", "total"),
]
FILE_COLUMNS = ["rank", "run", "device", "dump"]
# Output columns, in the native engine's field names (the SQL says n_rows for rows).
OUTPUT = [
    "rank",
    "run",
    "device",
    "dump",
    "rows",
    "peak_allocated",
    "peak_step",
    "reserved_peak",
    "leaked_bytes",
    "leaked_blocks",
    "top_owner",
    "top_owner_bytes",
    "stands_out",
]


class EngineError(Exception):
    """Why an engine cannot run: one line for the user."""


def sql_text() -> str:
    return SQL_FILE.read_text(encoding="utf-8").strip().rstrip(";")


def stand_out_factor(threshold_pct: int) -> float:
    """As the native engine computes it: ``1 + pct / 100`` in binary64."""
    return 1.0 + threshold_pct / 100.0


def _rows(names: list[str], values: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    out = []
    for value in values:
        row = dict(zip(names, value))
        row["rows"] = row.pop("n_rows")
        out.append({key: row[key] for key in OUTPUT})
    return out


def run_duckdb(dumps: list[dict[str, Any]], factor: float) -> list[dict[str, Any]]:
    try:
        import duckdb
    except ImportError:
        raise EngineError(
            f"the duckdb package is not installed for {sys.executable}: "
            "pip install 'msmemscope[duckdb]' (or pip install duckdb)"
        ) from None
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE files (rank BIGINT, run VARCHAR, device VARCHAR, dump VARCHAR, path VARCHAR)"
    )
    con.executemany(
        "INSERT INTO files VALUES (?, ?, ?, ?, ?)",
        [[d["rank"], d["run"], d["device"], d["dump"], path] for d in dumps for path in _files(d)],
    )
    columns = ", ".join(f'p."{src}" AS {name}' for src, name in COLUMNS)
    # A view cannot take parameters: the paths are written as SQL string literals.
    paths = ", ".join("'" + p.replace("'", "''") + "'" for d in dumps for p in _files(d))
    con.execute(
        f"CREATE VIEW dump AS SELECT f.rank, f.run, f.device, f.dump, {columns} "
        f"FROM read_parquet([{paths}], filename = true) p JOIN files f ON f.path = p.filename"
    )
    con.execute(f"CREATE VIEW params AS SELECT CAST({factor!r} AS DOUBLE) AS factor")
    result = con.execute(sql_text())
    names = [c[0] for c in result.description]
    return _rows(names, result.fetchall())


def _files(dump: dict[str, Any]) -> list[str]:
    """A dump's Parquet files: the dump's own, then the step parts a run longer than its dump
    budget kept beside it (``parts``)."""
    return [dump["parquet"], *dump.get("parts", [])]


def _local_path(uri: str) -> str:
    """The real path of the local file a Spark file URI (``file:/a%20b``) names."""
    return os.path.realpath(urllib.parse.unquote(urllib.parse.urlsplit(uri).path))


def run_spark(dumps: list[dict[str, Any]], factor: float) -> list[dict[str, Any]]:
    try:
        from pyspark import SparkConf
        from pyspark.sql import SparkSession
        from pyspark.sql import functions as F
        from pyspark.sql.types import (
            DoubleType,
            LongType,
            StringType,
            StructField,
            StructType,
        )
    except ImportError:
        raise EngineError(
            f"the pyspark package is not installed for {sys.executable}: "
            "pip install 'msmemscope[spark]' (or pip install pyspark); Spark also needs Java"
        ) from None
    builder = SparkSession.builder.appName("msmemscope ranks")
    master = os.environ.get("MSMEMSCOPE_SPARK_MASTER")
    if master:
        builder = builder.master(master)
    elif not SparkConf().contains("spark.master"):
        builder = builder.master("local[*]")
    builder = builder.config("spark.ui.enabled", "false").config(
        "spark.sql.session.timeZone", "UTC"
    )
    spark = builder.getOrCreate()
    try:
        spark.sparkContext.setLogLevel("ERROR")
        # One scan of all the files: a union of one scan per file grows a plan that Spark
        # fails to run at some 64 files. Each row's file comes from the _metadata column.
        scan = spark.read.parquet(*[p for d in dumps for p in _files(d)]).select(
            F.col("_metadata.file_path").alias("file_path"),
            *[F.col(f"`{src}`").alias(name) for src, name in COLUMNS],
        )
        # Spark names a file by a percent-encoded URI, and not always in the same form
        # (file:/a or file:///a), so the file table is keyed by the names this scan gives.
        by_path = {os.path.realpath(p): d for d in dumps for p in _files(d)}
        files_rows = []
        for row in scan.select("file_path").distinct().collect():
            d = by_path.get(_local_path(row.file_path))
            if d is None:
                raise EngineError(f"Spark read {row.file_path}, which no dump names")
            files_rows.append((row.file_path, d["rank"], d["run"], d["device"], d["dump"]))
        files_schema = StructType(
            [
                StructField("file_path", StringType(), False),
                StructField("rank", LongType(), True),
                *[StructField(c, StringType(), False) for c in FILE_COLUMNS[1:]],
            ]
        )
        files = spark.createDataFrame(files_rows, files_schema)
        table = scan.join(F.broadcast(files), "file_path").select(
            *FILE_COLUMNS, *[name for _, name in COLUMNS]
        )
        table.createOrReplaceTempView("dump")
        schema = StructType([StructField("factor", DoubleType(), False)])
        spark.createDataFrame([(factor,)], schema).createOrReplaceTempView("params")
        result = spark.sql(sql_text()).collect()
        names = list(result[0].asDict().keys()) if result else []
        return _rows(names, [tuple(r) for r in result])
    finally:
        spark.stop()


ENGINES = {"duckdb": run_duckdb, "spark": run_spark}


def main() -> int:
    try:
        request = json.load(sys.stdin)
        engine = ENGINES.get(request.get("engine"))
        if engine is None:
            raise EngineError(f"unknown engine {request.get('engine')!r}: accepted duckdb, spark")
        dumps = request["dumps"]
        if not dumps:
            json.dump([], sys.stdout)
            return 0
        rows = engine(dumps, stand_out_factor(int(request["threshold_pct"])))
    except EngineError as e:
        print(f"msmemscope: ranks: {e}", file=sys.stderr)
        return 1
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as e:
        print(f"msmemscope: ranks: malformed request: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # the engine's own errors (a file it cannot read, say): one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"msmemscope: ranks: {type(e).__name__}: {first}", file=sys.stderr)
        return 1
    json.dump(rows, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
