"""Does a Delta Lake / Iceberg jar work with the installed pyspark? (README "Tables" matrix)

    python bench/spark_tables_matrix.py delta|iceberg MAVEN_COORDINATES [IVY_DIR]

Run with each environment's python (e.g. one made by scripts/spark-env VERSION). Streams two
waves of JSON rows (150, then 30 more) into a table partitioned by topic and date with
AvailableNow, reading it back with Spark after each run; prints the session start time (the
first run of a coordinate includes Ivy's download), (rows, distinct ids) per run, and OK or
FAIL with the Java error. Exit 0 only if both runs read back exactly. No NSQ involved: this
measures the jar against Spark; tests/spark/test_tables.py does NSQ -> table end to end."""
import json, os, sys, time, tempfile, shutil
fmt, pkg = sys.argv[1], sys.argv[2]
ivy = sys.argv[3] if len(sys.argv) > 3 else None
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
from pyspark.sql import SparkSession, functions as F
import pyspark
d = tempfile.mkdtemp(prefix="tblprobe-")
src, out, ck = f"{d}/src", f"{d}/lake/events", f"{d}/ck"
os.makedirs(src)
b = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
     .config("spark.driver.host", "127.0.0.1").config("spark.jars.packages", pkg)
     .config("spark.sql.session.timeZone", "UTC").config("spark.sql.shuffle.partitions", "4"))
if ivy:
    b = b.config("spark.jars.ivy", ivy)
if fmt == "delta":
    b = (b.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
         .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"))
else:
    b = (b.config("spark.sql.extensions", "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions")
         .config("spark.sql.catalog.nsqcli", "org.apache.iceberg.spark.SparkCatalog")
         .config("spark.sql.catalog.nsqcli.type", "hadoop")
         .config("spark.sql.catalog.nsqcli.warehouse", os.path.dirname(out)))
t0 = time.monotonic()
spark = b.getOrCreate()
print("session", round(time.monotonic() - t0, 1), "s", "pyspark", pyspark.__version__, "spark", spark.version, flush=True)
schema = "body binary, id string, timestamp timestamp, topic string"
def wave(k, n):
    with open(f"{src}/w{k}.json", "w") as f:
        for i in range(n):
            f.write(json.dumps({"body": None, "id": f"{k}-{i}", "timestamp": "2026-01-01T00:00:00Z", "topic": "t%d" % (i % 2)}) + "\n")
def run():
    df = (spark.readStream.schema(schema).option("maxFilesPerTrigger", 1).json(src)
          .withColumn("date", F.to_date("timestamp")).withColumn("hour", F.hour("timestamp")))
    w = df.writeStream.format(fmt).option("checkpointLocation", ck).trigger(availableNow=True)
    if fmt == "delta":
        q = w.partitionBy("topic", "date").start(out)
    else:
        spark.sql(f"CREATE TABLE IF NOT EXISTS nsqcli.events ({', '.join(f'`{x.name}` {x.dataType.simpleString()}' for x in df.schema)}) USING iceberg PARTITIONED BY (topic, date)")
        q = w.option("fanout-enabled", "true").toTable("nsqcli.events")
    q.awaitTermination()
    r = spark.read.format(fmt).load(out)
    return r.count(), r.select("id").distinct().count()
try:
    wave(0, 100); wave(1, 50)
    print("run1", run(), flush=True)
    wave(2, 30)
    print("run2", run(), flush=True)
    print("partitions", sorted(os.listdir(out))[:6] if fmt == "delta" else sorted(os.listdir(out + "/data")))
    print("OK", flush=True)
except Exception as e:
    print("FAIL", type(e).__name__, [l for l in str(e).splitlines() if "rror" in l or "xception" in l][:3])
    sys.exit(1)
finally:
    shutil.rmtree(d, ignore_errors=True)
