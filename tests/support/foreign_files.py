"""Files Quarry did not write, as a user may keep them in a directory later (wrongly) used as
a namespace, at several depths and some named almost like Quarry's own: GC must never
delete any of them (issue 10, item 2). Used by the unit test of quarry.retention.classify
and by the Spark GC sweep test."""

HEX32 = "0123456789abcdef" * 2
JOB = "20240501T120000-0123456789ab"

FOREIGN_KEYS = [
    "app.conf",
    "home/user/thesis.tex",
    "data/notes.txt",
    "data/spark/x/readme",
    "_quarry/other",
    # almost upload data (data/<32 hex>)
    f"data/{HEX32}.bak",
    "data/" + "ABCDEF01" * 4,
    f"data/{HEX32}/x",
    f"x/data/{HEX32}",
    # almost ranges (content ids: 64 lowercase hex)
    "_quarry/ranges/" + "ab" * 31 + ".parquet",
    "_quarry/ranges/" + "ab" * 32 + ".parquet.old",
    "x/_quarry/ranges/" + "ab" * 32 + ".parquet",
    # almost Spark job files (data/spark/<job id>/part-NNNNN-cNNN-tN.<ext>)
    f"data/spark/{JOB}/part-00003-c001-t42.snappy.parquet.crc",
    f"data/spark/{JOB}/_SUCCESS",
    f"data/spark/{JOB}/sub/part-00003-c001-t42.csv",
    "data/spark/job/part-00000.parquet",
]
