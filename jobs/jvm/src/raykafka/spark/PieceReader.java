package raykafka.spark;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.LinkedBlockingQueue;
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
 * Reads the pieces (topic-partition [start, end) ranges) of one Spark partition as
 * columnar batches, one per Fetch response: each piece is fetched by a {@link RangeFetcher}
 * thread of its own (its own connection to its leader, up to {@code DEPTH} responses
 * ahead), all at once, and this thread decodes whichever response is ready first, so the
 * leaders serve several pieces at a time while one is decoded. A batch holds one piece's
 * records (topic and partition are constants per batch), in offset order per piece.
 *
 * Only the columns of {@code required} are decoded: with none (a count()), a batch wholly
 * inside its range counts by its header's record count; only a batch straddling the
 * range's start or end has its records walked (offset deltas) to clip it.
 *
 * A record batch v2 (big-endian; storage/records.py has the same table):
 * <pre>
 *   at  size  field
 *    0     8  baseOffset
 *    8     4  batchLength (bytes after this field: the batch is 12 + batchLength)
 *   12     4  partitionLeaderEpoch
 *   16     1  magic (2)
 *   17     4  crc: CRC32C of bytes 21 .. end (checked by RangeFetcher)
 *   21     2  attributes: bits 0-2 codec, 3 LogAppendTime, 4 transactional, 5 control
 *   23     4  lastOffsetDelta
 *   27     8  baseTimestamp
 *   35     8  maxTimestamp (every record's timestamp under LogAppendTime)
 *   43     8  producerId, 51: 2 producerEpoch, 53: 4 baseSequence
 *   57     4  recordCount
 *   61     -  records, compressed as a whole when the codec is not none; each:
 *             varint length, int8 attributes, varlong timestampDelta, varint offsetDelta,
 *             varint keyLength (-1 null), key, varint valueLength (-1 null), value,
 *             varint headerCount, [varint keyLength, key, varint valueLength, value]...
 * </pre>
 * Not thread-safe (a Spark task's reader); the fetch threads only hand it chunks.
 */
final class PieceReader implements PartitionReader<ColumnarBatch> {
  static final int HEADER_SIZE = 61;
  /** Responses a fetcher may hold undecoded. */
  static final int DEPTH = 2;

  private final TopicSource.Piece[] pieces;
  private final int fetchMaxBytes;
  private final long timeoutMs;
  private final String[] bootstrap;
  private final String clientId;
  private final int retries;

  // the columns asked for (null when not)
  private WritableColumnVector keyV, valueV, offsetV, tsV, tsTypeV, headersV, hStructV, hKeyV,
      hValueV;
  private ConstantColumnVector topicV, partitionV;
  private final WritableColumnVector[] writable;
  private final boolean decodeRecords;
  private final ColumnarBatch batch;

  private final LinkedBlockingQueue<Object> ready = new LinkedBlockingQueue<>();
  private RangeFetcher[] fetchers;
  private int running;
  private RangeFetcher.Chunk decoded;     // its permit is given back at the next call
  private final Map<String, UTF8String> topics = new HashMap<>();
  private int rows;
  // the record cursor (records of the batch being decoded)
  private byte[] rb;
  private int rp;
  private TopicSource.Piece piece;

  PieceReader(TopicSource.Piece[] pieces, StructType required, int fetchMaxBytes,
              long timeoutMs, String bootstrap, String clientId, int retries) {
    this.pieces = pieces;
    this.retries = retries;
    this.fetchMaxBytes = fetchMaxBytes;
    this.timeoutMs = timeoutMs;
    this.bootstrap = bootstrap.isEmpty() ? new String[0] : bootstrap.split(",");
    this.clientId = clientId;
    StructField[] fields = required.fields();
    ColumnVector[] columns = new ColumnVector[fields.length];
    WritableColumnVector[] w = new WritableColumnVector[fields.length];
    int nw = 0;
    boolean records = false;
    for (int i = 0; i < fields.length; i++) {
      String name = fields[i].name();
      DataType type = fields[i].dataType();
      if (name.equals("topic")) {
        topicV = new ConstantColumnVector(Integer.MAX_VALUE, type);
        columns[i] = topicV;
        continue;
      }
      if (name.equals("partition")) {
        partitionV = new ConstantColumnVector(Integer.MAX_VALUE, type);
        columns[i] = partitionV;
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
    if (fetchers == null) {
      fetchers = new RangeFetcher[pieces.length];
      for (int i = 0; i < pieces.length; i++) {
        fetchers[i] = new RangeFetcher(pieces[i], fetchMaxBytes, timeoutMs, bootstrap,
            clientId, retries, ready, DEPTH);
      }
      running = fetchers.length;
      for (RangeFetcher f : fetchers) f.start();
    }
    while (true) {
      if (decoded != null) {
        decoded.source.permits.release();
        decoded = null;
      }
      if (running == 0) return false;
      Object item;
      try {
        item = ready.take();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("raykafka source: interrupted", e);
      }
      if (item instanceof RangeFetcher.End) {
        RangeFetcher.End end = (RangeFetcher.End) item;
        running--;
        if (end.error != null) {
          throw end.error instanceof IOException ? (IOException) end.error
              : new IOException(end.error.toString(), end.error);
        }
        continue;
      }
      RangeFetcher.Chunk chunk = (RangeFetcher.Chunk) item;
      decoded = chunk;
      piece = chunk.source.piece;
      rows = 0;
      for (WritableColumnVector v : writable) v.reset();
      byte[] b = chunk.buf;
      for (int q = chunk.from; q < chunk.to; q += 12 + getInt(b, q + 8)) {
        decodeBatch(b, q, 12 + getInt(b, q + 8), chunk.lo, chunk.hi);
      }
      if (rows > 0) {
        if (topicV != null) {
          topicV.setUtf8String(topics.computeIfAbsent(piece.topic, UTF8String::fromString));
        }
        if (partitionV != null) partitionV.setInt(piece.partition);
        batch.setNumRows(rows);
        return true;
      }
    }
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
    int regionEnd;
    if (codec == 0) {
      rb = b;
      rp = p + HEADER_SIZE;
      regionEnd = p + size;
    } else {
      rb = decompress(codec, b, p + HEADER_SIZE, size - HEADER_SIZE, base);
      rp = 0;
      regionEnd = rb.length;
    }
    for (int i = 0; i < count; i++) {
      int length = readVarint();
      int end = rp + length;
      if (length < 0 || end > regionEnd) {
        throw new IOException(piece + ": record " + i + " of the batch at offset " + base
            + " has a length of " + length + " bytes, past the batch's end");
      }
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
    if (fetchers != null) {
      for (RangeFetcher f : fetchers) f.stop();
    }
    ready.clear();
    batch.close();
  }
}
