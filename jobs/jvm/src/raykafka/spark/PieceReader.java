package raykafka.spark;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.zip.CRC32C;
import java.util.zip.GZIPInputStream;

import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.ConstantColumnVector;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Reads one piece (topic-partition [start, end)) as columnar batches, one per fetch.
 * Only the columns of {@code required} are decoded: with none (a count()), a batch wholly
 * inside the range counts by its header's record count; only a batch straddling the
 * range's start or end has its records walked (offset deltas) to clip it.
 *
 * The next Fetch is sent as soon as a response's batch headers say where it ends, before
 * its records are decoded: the broker reads the next fetch while this one decodes.
 * A failed connection or a retriable error (a moved leader, a timeout) reconnects, to the
 * leader a Metadata request names when bootstrap addresses were given, and goes on from
 * the first offset not yet handed to Spark, at most RETRIES times in a row.
 */
final class PieceReader implements PartitionReader<ColumnarBatch> {
  static final int RETRIES = 10;
  static final int HEADER_SIZE = 61;
  static final int MAX_EMPTY_FETCHES = 200;

  private final TopicSource.Piece piece;
  private final int fetchMaxBytesInitial;
  private int fetchMaxBytes;
  private final long timeoutMs;
  private final long startedMs = System.currentTimeMillis();
  private final String[] bootstrap;
  private final String clientId;
  private final CRC32C crc = new CRC32C();

  // the columns asked for (null when not)
  private WritableColumnVector keyV, valueV, offsetV, tsV, tsTypeV, headersV, hStructV, hKeyV,
      hValueV;
  private final WritableColumnVector[] writable;
  private final boolean decodeRecords;
  private final ColumnarBatch batch;

  private KafkaConnection conn;
  private String host;
  private int port;
  private long pos;                // first offset not yet handed to Spark
  private long inflight = -1;      // fetch offset of the request sent and not yet read
  private boolean done;
  private int failures;
  private int empties;
  private int rows;
  // the record cursor (records of the batch being decoded)
  private byte[] rb;
  private int rp;

  PieceReader(TopicSource.Piece piece, StructType required, int fetchMaxBytes, long timeoutMs,
              String bootstrap, String clientId) {
    this.piece = piece;
    this.fetchMaxBytesInitial = fetchMaxBytes;
    this.fetchMaxBytes = fetchMaxBytes;
    this.timeoutMs = timeoutMs;
    this.bootstrap = bootstrap.isEmpty() ? new String[0] : bootstrap.split(",");
    this.clientId = clientId;
    this.host = piece.host;
    this.port = piece.port;
    this.pos = piece.start;
    this.done = piece.start >= piece.end;
    StructField[] fields = required.fields();
    ColumnVector[] columns = new ColumnVector[fields.length];
    WritableColumnVector[] w = new WritableColumnVector[fields.length];
    int nw = 0;
    boolean records = false;
    for (int i = 0; i < fields.length; i++) {
      String name = fields[i].name();
      DataType type = fields[i].dataType();
      if (name.equals("topic")) {
        ConstantColumnVector c = new ConstantColumnVector(Integer.MAX_VALUE, type);
        c.setUtf8String(UTF8String.fromString(piece.topic));
        columns[i] = c;
        continue;
      }
      if (name.equals("partition")) {
        ConstantColumnVector c = new ConstantColumnVector(Integer.MAX_VALUE, type);
        c.setInt(piece.partition);
        columns[i] = c;
        continue;
      }
      OnHeapColumnVector v = new OnHeapColumnVector(4096, type);
      columns[i] = v;
      w[nw++] = v;
      records = true;
      switch (name) {
        case "key": keyV = v; break;
        case "value": valueV = v; break;
        case "offset": offsetV = v; break;
        case "timestamp": tsV = v; break;
        case "timestampType": tsTypeV = v; break;
        case "headers":
          headersV = v;
          hStructV = v.arrayData();
          hKeyV = hStructV.getChild(0);
          hValueV = hStructV.getChild(1);
          break;
        default: throw new IllegalArgumentException("raykafka source: no column " + name);
      }
    }
    this.writable = java.util.Arrays.copyOf(w, nw);
    this.decodeRecords = records;
    this.batch = new ColumnarBatch(columns);
  }

  @Override
  public boolean next() throws IOException {
    while (!done) {
      if (timeoutMs >= 0 && System.currentTimeMillis() - startedMs >= timeoutMs) {
        done = true;        // as read_topic's timeout_ms: what was read is the answer
        return false;
      }
      KafkaConnection.FetchAnswer answer;
      try {
        if (conn == null) {
          conn = new KafkaConnection(host, port, clientId);
          inflight = -1;
        }
        if (inflight != pos) {
          conn.sendFetch(piece.topic, piece.partition, pos, fetchMaxBytes);
          inflight = pos;
        }
        answer = conn.readFetch(piece.topic, piece.partition);
        inflight = -1;
        if (answer.errorCode != 0) {
          throw new KafkaConnection.KafkaErrorException(answer.errorCode,
              piece + ": the leader answered error " + KafkaConnection.errorName(answer.errorCode));
        }
      } catch (IOException e) {
        retry(e);
        continue;
      }
      failures = 0;
      byte[] b = answer.buf;
      int p = answer.recordsOffset;
      int limit = p + answer.recordsLength;
      // walk the complete batches' headers: where the next fetch starts
      long next = pos;
      int scanEnd = p;
      while (limit - p >= HEADER_SIZE) {
        long base = getLong(b, p);
        int size = 12 + getInt(b, p + 8);
        if (size < HEADER_SIZE || size > limit - p) break;        // a partial batch
        if (base >= piece.end) { next = piece.end; break; }
        long last = base + getInt(b, p + 23);
        if (last + 1 > next) next = last + 1;
        p += size;
        scanEnd = p;
      }
      if (next > piece.end) next = piece.end;
      if (scanEnd == answer.recordsOffset) {           // no complete batch in range
        if (next >= piece.end) { done = true; break; }
        if (answer.recordsLength > 0) {                  // one batch larger than asked for
          if (fetchMaxBytes >= (1 << 30)) {
            throw new IOException(piece + ": a record batch at offset " + pos
                + " does not fit in a fetch of " + fetchMaxBytes + " bytes");
          }
          fetchMaxBytes = Math.min(1 << 30, fetchMaxBytes * 2);
          continue;
        }
        if (pos >= answer.highWatermark) { done = true; break; }   // nothing more committed
        if (++empties > MAX_EMPTY_FETCHES) {
          throw new IOException(piece + ": " + empties + " empty fetches at offset " + pos
              + " below the high watermark " + answer.highWatermark);
        }
        continue;
      }
      empties = 0;
      fetchMaxBytes = fetchMaxBytesInitial;
      long lo = pos;
      if (next < piece.end) {
        try {
          conn.sendFetch(piece.topic, piece.partition, next, fetchMaxBytes);
          inflight = next;
        } catch (IOException e) {
          closeConnection();        // the next round reconnects and asks again
        }
      } else {
        done = true;
      }
      rows = 0;
      for (WritableColumnVector v : writable) v.reset();
      for (int q = answer.recordsOffset; q < scanEnd; q += 12 + getInt(b, q + 8)) {
        decodeBatch(b, q, 12 + getInt(b, q + 8), lo, piece.end);
      }
      pos = next;
      if (rows > 0) {
        batch.setNumRows(rows);
        return true;
      }
    }
    return false;
  }

  private void retry(IOException e) throws IOException {
    closeConnection();
    boolean retriable = !(e instanceof KafkaConnection.KafkaErrorException)
        || ((KafkaConnection.KafkaErrorException) e).retriable();
    if (!retriable || ++failures > RETRIES) {
      throw new IOException("raykafka source: reading " + piece + " at offset " + pos
          + " failed: " + e.getMessage(), e);
    }
    try {
      Thread.sleep(Math.min(1000L, 50L << Math.min(failures, 5)));
    } catch (InterruptedException ie) {
      Thread.currentThread().interrupt();
      throw new IOException("interrupted", ie);
    }
    if (bootstrap.length > 0) {
      for (String address : bootstrap) {
        int colon = address.lastIndexOf(':');
        try (KafkaConnection c = new KafkaConnection(address.substring(0, colon),
            Integer.parseInt(address.substring(colon + 1)), clientId)) {
          String leader = c.leaderOf(piece.topic, piece.partition);
          if (leader != null) {
            int at = leader.lastIndexOf(':');
            host = leader.substring(0, at);
            port = Integer.parseInt(leader.substring(at + 1));
            return;
          }
        } catch (IOException | RuntimeException ignored) {
          // the next address, or the same leader again
        }
      }
    }
  }

  private void closeConnection() {
    if (conn != null) {
      conn.close();
      conn = null;
    }
    inflight = -1;
  }

  /** The records of the batch at b[p, p+size) with offsets in [lo, hi), appended. */
  private void decodeBatch(byte[] b, int p, int size, long lo, long hi) throws IOException {
    long base = getLong(b, p);
    byte magic = b[p + 16];
    if (magic != 2) {
      throw new IOException(piece + ": record batch of magic " + magic + " at offset " + base
          + "; the JVM reader decodes magic 2 only");
    }
    int attributes = getShort(b, p + 21);
    long stored = getInt(b, p + 17) & 0xffffffffL;
    crc.reset();
    crc.update(b, p + 21, size - 21);
    if (crc.getValue() != stored) {
      throw new IOException(piece + ": the record batch at offset " + base
          + " fails its CRC32C check");
    }
    if ((attributes & 0x20) != 0) return;             // a control batch (transaction marker)
    long last = base + getInt(b, p + 23);
    if (last < lo || base >= hi) return;
    int count = getInt(b, p + 57);
    if (!decodeRecords && base >= lo && last < hi) {
      rows += count;
      return;
    }
    int codec = attributes & 7;
    boolean logAppend = (attributes & 8) != 0;
    long baseTs = getLong(b, p + 27);
    long maxTs = getLong(b, p + 35);
    if (codec == 0) {
      rb = b;
      rp = p + HEADER_SIZE;
    } else {
      rb = decompress(codec, b, p + HEADER_SIZE, size - HEADER_SIZE, base);
      rp = 0;
    }
    for (int i = 0; i < count; i++) {
      int length = readVarint();
      int end = rp + length;
      rp++;                                            // attributes
      long tsDelta = readVarlong();
      long offset = base + readVarint();
      if (offset < lo || offset >= hi) {
        rp = end;
        continue;
      }
      rows++;
      if (!decodeRecords) {
        rp = end;
        continue;
      }
      int keyLen = readVarint();
      if (keyV != null) {
        if (keyLen < 0) keyV.appendNull(); else keyV.appendByteArray(rb, rp, keyLen);
      }
      if (keyLen > 0) rp += keyLen;
      int valueLen = readVarint();
      if (valueV != null) {
        if (valueLen < 0) valueV.appendNull(); else valueV.appendByteArray(rb, rp, valueLen);
      }
      if (valueLen > 0) rp += valueLen;
      if (offsetV != null) offsetV.appendLong(offset);
      long ts = logAppend ? maxTs : baseTs + tsDelta;
      if (tsV != null) tsV.appendLong(ts * 1000L);
      if (tsTypeV != null) tsTypeV.appendInt(ts == -1 ? -1 : (logAppend ? 1 : 0));
      if (headersV != null) {
        int n = readVarint();
        if (n <= 0) {
          headersV.appendNull();
        } else {
          headersV.appendArray(n);
          for (int h = 0; h < n; h++) {
            hStructV.appendStruct(false);
            int kl = readVarint();
            if (kl < 0) hKeyV.appendNull(); else { hKeyV.appendByteArray(rb, rp, kl); rp += kl; }
            int vl = readVarint();
            if (vl < 0) hValueV.appendNull(); else { hValueV.appendByteArray(rb, rp, vl); rp += vl; }
          }
        }
      }
      rp = end;
    }
    rb = null;
  }

  private byte[] decompress(int codec, byte[] b, int off, int len, long base) throws IOException {
    InputStream raw = new ByteArrayInputStream(b, off, len);
    InputStream in;
    switch (codec) {
      case 1: in = new GZIPInputStream(raw, 64 * 1024); break;
      case 2: in = new org.xerial.snappy.SnappyInputStream(raw); break;
      case 3: in = new net.jpountz.lz4.LZ4FrameInputStream(raw); break;
      case 4: in = new com.github.luben.zstd.ZstdInputStream(raw); break;
      default:
        throw new IOException(piece + ": record batch at offset " + base
            + " has an unknown compression codec " + codec);
    }
    try (InputStream s = in) {
      return s.readAllBytes();
    }
  }

  private int readVarint() {
    int value = 0;
    int shift = 0;
    while (true) {
      byte x = rb[rp++];
      value |= (x & 0x7f) << shift;
      if (x >= 0) break;
      shift += 7;
    }
    return (value >>> 1) ^ -(value & 1);
  }

  private long readVarlong() {
    long value = 0;
    int shift = 0;
    while (true) {
      byte x = rb[rp++];
      value |= (long) (x & 0x7f) << shift;
      if (x >= 0) break;
      shift += 7;
    }
    return (value >>> 1) ^ -(value & 1);
  }

  static long getLong(byte[] b, int p) {
    return ((long) getInt(b, p) << 32) | (getInt(b, p + 4) & 0xffffffffL);
  }

  static int getInt(byte[] b, int p) {
    return ((b[p] & 0xff) << 24) | ((b[p + 1] & 0xff) << 16) | ((b[p + 2] & 0xff) << 8)
        | (b[p + 3] & 0xff);
  }

  static int getShort(byte[] b, int p) {
    return (short) (((b[p] & 0xff) << 8) | (b[p + 1] & 0xff));
  }

  @Override
  public ColumnarBatch get() {
    return batch;
  }

  @Override
  public void close() {
    closeConnection();
    batch.close();
  }

  static byte[] utf8(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }
}
