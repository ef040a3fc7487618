"""The JVM side of ``jobs.spark.read_topic_df``: a Spark DataSource V2 in Java
(``src/raykafka/spark``), built into a jar on first use (``build.jar_path``)."""
