package raykafka.spark;

import java.util.ArrayList;
import java.util.Collections;
import java.util.EnumSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Expression;
import org.apache.spark.sql.connector.expressions.NamedReference;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.expressions.aggregate.AggregateFunc;
import org.apache.spark.sql.connector.expressions.aggregate.Aggregation;
import org.apache.spark.sql.connector.expressions.aggregate.Count;
import org.apache.spark.sql.connector.expressions.aggregate.CountStar;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownAggregates;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * A Spark DataSource V2 over raykafka topics (jobs/spark.py read_topic_df): the driver
 * (Python) resolves the offset ranges and the leaders' PLAINTEXT listeners and passes them
 * as the option {@code pieces}: one line per Spark partition,
 * {@code topic \t partition \t start \t end \t host \t port [\t count]}. Each Spark task fetches its
 * range from the leader over Kafka's wire protocol (Fetch v4, record batches v2) and hands
 * Spark columnar batches of the columns the query needs (SupportsPushDownRequiredColumns):
 * a count() decodes batch headers only.
 *
 * <p>Aggregate push-down (SupportsPushDownAggregates): when the driver counted every piece
 * from the leaders' batch headers (a seventh field, {@code count}, -1 when unknown),
 * {@code COUNT(*)} (and COUNT of the never-null topic, partition and offset columns),
 * grouped by nothing, topic and/or partition, is answered from those counts: no fetch and
 * no executor read, as Parquet answers a count from its footers.
 *
 * Options: {@code pieces} (required), {@code ranges_per_task} (pieces one Spark partition
 * reads at once, each from its own leader connection; default 1), {@code fetch_max_bytes}
 * (default 4 MiB),
 * {@code timeout_ms} (stop a range after that long, as read_topic's option; default none),
 * {@code bootstrap} (comma-separated host:port of every broker, to find a moved leader),
 * {@code retries} (failed fetches in a row before the task fails; default 10),
 * {@code client_id}.
 */
public final class TopicSource implements TableProvider {

  /** Spark's Kafka source columns (includeHeaders on), in its order. */
  public static final StructType SCHEMA = new StructType(new StructField[] {
      DataTypes.createStructField("key", DataTypes.BinaryType, true),
      DataTypes.createStructField("value", DataTypes.BinaryType, true),
      DataTypes.createStructField("topic", DataTypes.StringType, true),
      DataTypes.createStructField("partition", DataTypes.IntegerType, true),
      DataTypes.createStructField("offset", DataTypes.LongType, true),
      DataTypes.createStructField("timestamp", DataTypes.TimestampType, true),
      DataTypes.createStructField("timestampType", DataTypes.IntegerType, true),
      DataTypes.createStructField("headers", DataTypes.createArrayType(new StructType(
          new StructField[] {
              DataTypes.createStructField("key", DataTypes.StringType, true),
              DataTypes.createStructField("value", DataTypes.BinaryType, true)}), true), true),
  });

  @Override
  public StructType inferSchema(CaseInsensitiveStringMap options) {
    return SCHEMA;
  }

  @Override
  public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> props) {
    return new TopicTable();
  }

  static final class TopicTable implements Table, SupportsRead {
    @Override public String name() { return "raykafka"; }
    @SuppressWarnings("deprecation")
    @Override public StructType schema() { return SCHEMA; }
    @Override public Set<TableCapability> capabilities() {
      return EnumSet.of(TableCapability.BATCH_READ);
    }
    @Override public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
      return new TopicScanBuilder(options);
    }
  }

  static final class TopicScanBuilder
      implements ScanBuilder, SupportsPushDownRequiredColumns, SupportsPushDownAggregates {
    private final CaseInsensitiveStringMap options;
    private StructType required = SCHEMA;
    private CountScan counted;

    TopicScanBuilder(CaseInsensitiveStringMap options) { this.options = options; }

    @Override public boolean supportCompletePushDown(Aggregation aggregation) {
      return true;      // pushAggregation accepts only what the counts answer whole
    }

    @Override public boolean pushAggregation(Aggregation aggregation) {
      List<Piece> pieces = Piece.parseAll(options.getOrDefault("pieces", ""));
      if (pieces.isEmpty() || options.containsKey("timeout_ms")) return false;
      for (Piece p : pieces) if (p.count < 0) return false;
      List<String> groups = new ArrayList<>();
      for (Expression e : aggregation.groupByExpressions()) {
        String name = columnName(e);
        if (!"topic".equals(name) && !"partition".equals(name)) return false;
        groups.add(name);
      }
      for (AggregateFunc f : aggregation.aggregateExpressions()) {
        if (f instanceof CountStar) continue;
        if (f instanceof Count && !((Count) f).isDistinct()) {
          String name = columnName(((Count) f).column());
          if ("topic".equals(name) || "partition".equals(name) || "offset".equals(name)) {
            continue;
          }
        }
        return false;
      }
      counted = new CountScan(pieces, groups, aggregation.aggregateExpressions().length);
      return true;
    }

    private static String columnName(Expression e) {
      if (!(e instanceof NamedReference)) return null;
      String[] names = ((NamedReference) e).fieldNames();
      return names.length == 1 ? names[0] : null;
    }

    @Override public void pruneColumns(StructType requiredSchema) {
      // keep SCHEMA's field types; only the names decide what is decoded
      List<StructField> out = new ArrayList<>();
      for (StructField f : requiredSchema.fields()) {
        out.add(SCHEMA.apply(f.name()));
      }
      required = new StructType(out.toArray(new StructField[0]));
    }

    @Override public Scan build() {
      return counted != null ? counted : new TopicScan(options, required);
    }
  }

  /** A pushed-down count: one row per group, from the pieces' counts. */
  static final class CountScan implements Scan, Batch {
    private final List<String> groups;
    private final int aggregates;
    private final List<Object[]> rows = new ArrayList<>();

    CountScan(List<Piece> pieces, List<String> groups, int aggregates) {
      this.groups = groups;
      this.aggregates = aggregates;
      Map<List<Object>, Long> totals = new LinkedHashMap<>();
      if (groups.isEmpty()) totals.put(Collections.emptyList(), 0L);
      for (Piece p : pieces) {
        List<Object> key = new ArrayList<>();
        for (String g : groups) key.add("topic".equals(g) ? (Object) p.topic : p.partition);
        if (p.count == 0 && !groups.isEmpty()) continue;   // no rows: no group
        totals.merge(key, p.count, Long::sum);
      }
      for (Map.Entry<List<Object>, Long> e : totals.entrySet()) {
        Object[] row = new Object[groups.size() + aggregates];
        for (int i = 0; i < groups.size(); i++) {
          Object v = e.getKey().get(i);
          row[i] = v instanceof String ? UTF8String.fromString((String) v) : v;
        }
        for (int i = 0; i < aggregates; i++) row[groups.size() + i] = e.getValue();
        rows.add(row);
      }
    }

    @Override public StructType readSchema() {
      List<StructField> out = new ArrayList<>();
      for (String g : groups) out.add(SCHEMA.apply(g));
      for (int i = 0; i < aggregates; i++) {
        out.add(DataTypes.createStructField("count" + i, DataTypes.LongType, false));
      }
      return new StructType(out.toArray(new StructField[0]));
    }

    @Override public String description() {
      return "RaykafkaScan [pushed: COUNT" + (groups.isEmpty() ? "" : " GROUP BY "
          + String.join(",", groups)) + ", from the leaders' batch headers, " + rows.size()
          + " rows]";
    }

    @Override public Batch toBatch() { return this; }

    @Override public InputPartition[] planInputPartitions() {
      return new InputPartition[] {new CountRows(rows)};
    }

    @Override public PartitionReaderFactory createReaderFactory() {
      return new CountReaderFactory();
    }
  }

  /** The rows of a pushed-down count (one Spark partition holds them all). */
  static final class CountRows implements InputPartition {
    private static final long serialVersionUID = 1L;
    final ArrayList<Object[]> rows;

    CountRows(List<Object[]> rows) { this.rows = new ArrayList<>(rows); }
  }

  static final class CountReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;

    @Override public PartitionReader<InternalRow> createReader(InputPartition partition) {
      final List<Object[]> rows = ((CountRows) partition).rows;
      return new PartitionReader<InternalRow>() {
        private int next = -1;
        @Override public boolean next() { return ++next < rows.size(); }
        @Override public InternalRow get() { return new GenericInternalRow(rows.get(next)); }
        @Override public void close() { }
      };
    }
  }

  static final class TopicScan implements Scan, Batch {
    private final StructType required;
    private final List<Piece> pieces;
    private final int rangesPerTask;
    private final int fetchMaxBytes;
    private final long timeoutMs;
    private final String bootstrap;
    private final String clientId;
    private final int retries;

    TopicScan(CaseInsensitiveStringMap options, StructType required) {
      this.required = required;
      this.pieces = Piece.parseAll(options.getOrDefault("pieces", ""));
      this.rangesPerTask = Math.max(1, options.getInt("ranges_per_task", 1));
      this.fetchMaxBytes = options.getInt("fetch_max_bytes", 4 << 20);
      this.timeoutMs = options.getLong("timeout_ms", -1L);
      this.bootstrap = options.getOrDefault("bootstrap", "");
      this.clientId = options.getOrDefault("client_id", "raykafka-spark");
      this.retries = Math.max(0, options.getInt("retries", RangeFetcher.DEFAULT_RETRIES));
    }

    @Override public StructType readSchema() { return required; }

    @Override public String description() {
      long offsets = 0;
      for (Piece p : pieces) offsets += p.end - p.start;
      return "RaykafkaScan [" + pieces.size() + " ranges, " + offsets + " offsets, "
          + rangesPerTask + " ranges per task, columns: "
          + String.join(",", required.fieldNames()) + "]";
    }

    @Override public Batch toBatch() { return this; }

    @Override public InputPartition[] planInputPartitions() {
      List<InputPartition> out = new ArrayList<>();
      for (int i = 0; i < pieces.size(); i += rangesPerTask) {
        out.add(new Task(pieces.subList(i, Math.min(pieces.size(), i + rangesPerTask))
            .toArray(new Piece[0])));
      }
      return out.toArray(new InputPartition[0]);
    }

    @Override public PartitionReaderFactory createReaderFactory() {
      return new ReaderFactory(required, fetchMaxBytes, timeoutMs, bootstrap, clientId, retries);
    }
  }

  static final class ReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;
    private final StructType required;
    private final int fetchMaxBytes;
    private final long timeoutMs;
    private final String bootstrap;
    private final String clientId;
    private final int retries;

    ReaderFactory(StructType required, int fetchMaxBytes, long timeoutMs, String bootstrap,
                  String clientId, int retries) {
      this.retries = retries;
      this.required = required;
      this.fetchMaxBytes = fetchMaxBytes;
      this.timeoutMs = timeoutMs;
      this.bootstrap = bootstrap;
      this.clientId = clientId;
    }

    @Override public boolean supportColumnarReads(InputPartition partition) { return true; }

    @Override public PartitionReader<InternalRow> createReader(InputPartition partition) {
      throw new UnsupportedOperationException("the raykafka source reads columnar batches only");
    }

    @Override public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition p) {
      return new PieceReader(((Task) p).pieces, required, fetchMaxBytes, timeoutMs, bootstrap,
          clientId, retries);
    }
  }

  /** One Spark partition: the pieces it reads (at once). */
  public static final class Task implements InputPartition {
    private static final long serialVersionUID = 1L;
    final Piece[] pieces;

    Task(Piece[] pieces) { this.pieces = pieces; }
  }

  /** The offsets [start, end) of topic-partition, led by host:port. */
  public static final class Piece implements java.io.Serializable {
    private static final long serialVersionUID = 1L;
    final String topic;
    final int partition;
    final long start;
    final long end;
    final String host;
    final int port;
    final long count;       // records in [start, end), counted by the driver; -1: unknown

    Piece(String topic, int partition, long start, long end, String host, int port,
          long count) {
      this.topic = topic;
      this.partition = partition;
      this.start = start;
      this.end = end;
      this.host = host;
      this.port = port;
      this.count = count;
    }

    static List<Piece> parseAll(String text) {
      if (text.isEmpty()) return Collections.emptyList();
      List<Piece> out = new ArrayList<>();
      for (String line : text.split("\n")) {
        if (line.isEmpty()) continue;
        String[] f = line.split("\t");
        if (f.length != 6 && f.length != 7) {
          throw new IllegalArgumentException("raykafka source: a piece must be topic, "
              + "partition, start, end, host, port (and its record count) separated by "
              + "tabs, got " + line);
        }
        out.add(new Piece(f[0], Integer.parseInt(f[1]), Long.parseLong(f[2]),
            Long.parseLong(f[3]), f[4], Integer.parseInt(f[5]),
            f.length == 7 ? Long.parseLong(f[6]) : -1L));
      }
      return out;
    }

    @Override public String toString() {
      return topic + "-" + partition + " [" + start + ", " + end + ") at " + host + ":" + port;
    }
  }
}
