package raykafka.spark;

import java.io.IOException;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.Semaphore;
import java.util.zip.CRC32C;

/**
 * Fetches one piece (topic-partition [start, end)) from its leader on a thread of its own
 * and hands the reader {@link Chunk}s: one Fetch response's complete record batches, CRC
 * checked, with the offsets to keep. At most {@code depth} chunks wait unread (a permit
 * each, given back when the reader has decoded one).
 *
 * The next Fetch is sent as soon as a response's batch headers say where it ends, before
 * the batches are checked and handed on. A broken connection or a retriable error (a
 * moved leader, a timeout) reconnects, to the leader a Metadata request names when
 * bootstrap addresses were given, and goes on from the first offset not yet handed on, at
 * most {@code retries} times in a row.
 */
final class RangeFetcher implements Runnable {
  static final int DEFAULT_RETRIES = 10;
  static final int HEADER_SIZE = 61;
  static final int MAX_EMPTY_FETCHES = 200;

  /** One response's batches buf[from, to), whose records in [lo, hi) are the piece's. */
  static final class Chunk {
    final RangeFetcher source;
    final byte[] buf;
    final int from;
    final int to;
    final long lo;
    final long hi;

    Chunk(RangeFetcher source, byte[] buf, int from, int to, long lo, long hi) {
      this.source = source;
      this.buf = buf;
      this.from = from;
      this.to = to;
      this.lo = lo;
      this.hi = hi;
    }
  }

  /** What a fetcher puts last: null error when it read its whole piece. */
  static final class End {
    final RangeFetcher source;
    final Throwable error;

    End(RangeFetcher source, Throwable error) {
      this.source = source;
      this.error = error;
    }
  }

  final TopicSource.Piece piece;
  private final int fetchMaxBytesInitial;
  private final long deadlineMs;
  private final String[] bootstrap;
  private final String clientId;
  private final int retries;
  private final BlockingQueue<Object> out;
  final Semaphore permits;
  private final CRC32C crc = new CRC32C();
  private volatile boolean stopped;
  private volatile KafkaConnection conn;
  private Thread thread;

  private int fetchMaxBytes;
  private String host;
  private int port;
  private long pos;
  private long inflight = -1;
  private int failures;
  private int empties;

  RangeFetcher(TopicSource.Piece piece, int fetchMaxBytes, long timeoutMs, String[] bootstrap,
               String clientId, int retries, BlockingQueue<Object> out, int depth) {
    this.retries = retries;
    this.piece = piece;
    this.fetchMaxBytesInitial = fetchMaxBytes;
    this.fetchMaxBytes = fetchMaxBytes;
    this.deadlineMs = timeoutMs < 0 ? Long.MAX_VALUE : System.currentTimeMillis() + timeoutMs;
    this.bootstrap = bootstrap;
    this.clientId = clientId;
    this.out = out;
    this.permits = new Semaphore(depth);
    this.host = piece.host;
    this.port = piece.port;
    this.pos = piece.start;
  }

  void start() {
    thread = new Thread(this, "raykafka-fetch-" + piece.topic + "-" + piece.partition);
    thread.setDaemon(true);
    thread.start();
  }

  void stop() {
    stopped = true;
    if (thread != null) thread.interrupt();
    closeConnection();
  }

  @Override
  public void run() {
    Throwable error = null;
    try {
      fetchAll();
    } catch (Throwable t) {
      error = t;
    } finally {
      closeConnection();
    }
    if (!stopped) out.add(new End(this, error));
  }

  private void fetchAll() throws IOException, InterruptedException {
    while (pos < piece.end && !stopped) {
      if (System.currentTimeMillis() >= deadlineMs) return;   // read_topic's timeout_ms
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
        answer = conn.readFetch(piece.topic, piece.partition, true);
        inflight = -1;
        if (answer.errorCode != 0) {
          throw new KafkaConnection.KafkaErrorException(answer.errorCode, piece
              + ": the leader answered error " + KafkaConnection.errorName(answer.errorCode));
        }
      } catch (IOException e) {
        if (stopped) return;
        retry(e);
        continue;
      }
      failures = 0;
      byte[] b = answer.buf;
      int p = answer.recordsOffset;
      int limit = p + answer.recordsLength;
      long next = pos;
      int scanEnd = p;
      while (limit - p >= HEADER_SIZE) {            // the complete batches' headers
        long base = PieceReader.getLong(b, p);
        int size = 12 + PieceReader.getInt(b, p + 8);
        if (size < HEADER_SIZE || size > limit - p) break;      // a partial batch
        if (base >= piece.end) { next = piece.end; break; }
        long last = base + PieceReader.getInt(b, p + 23);
        if (last + 1 > next) next = last + 1;
        p += size;
        scanEnd = p;
      }
      if (next > piece.end) next = piece.end;
      if (scanEnd == answer.recordsOffset) {         // no complete batch in the range
        if (next >= piece.end) return;
        if (answer.recordsLength > 0) {              // one batch larger than asked for
          if (fetchMaxBytes >= (1 << 30)) {
            throw new IOException(piece + ": a record batch at offset " + pos
                + " does not fit in a fetch of " + fetchMaxBytes + " bytes");
          }
          fetchMaxBytes = Math.min(1 << 30, fetchMaxBytes * 2);
          continue;
        }
        if (pos >= answer.highWatermark) return;    // nothing more committed
        if (++empties > MAX_EMPTY_FETCHES) {
          throw new IOException(piece + ": " + empties + " empty fetches at offset " + pos
              + " below the high watermark " + answer.highWatermark);
        }
        continue;
      }
      empties = 0;
      fetchMaxBytes = fetchMaxBytesInitial;
      if (next < piece.end) {
        try {
          conn.sendFetch(piece.topic, piece.partition, next, fetchMaxBytes);
          inflight = next;
        } catch (IOException e) {
          closeConnection();                         // the next round reconnects, asks again
        }
      }
      for (int q = answer.recordsOffset; q < scanEnd; q += 12 + PieceReader.getInt(b, q + 8)) {
        checkCrc(b, q, 12 + PieceReader.getInt(b, q + 8));
      }
      permits.acquire();
      out.add(new Chunk(this, b, answer.recordsOffset, scanEnd, pos, piece.end));
      pos = next;
    }
  }

  private void checkCrc(byte[] b, int p, int size) throws IOException {
    long stored = PieceReader.getInt(b, p + 17) & 0xffffffffL;
    crc.reset();
    crc.update(b, p + 21, size - 21);
    if (crc.getValue() != stored) {
      throw new IOException(piece + ": the record batch at offset " + PieceReader.getLong(b, p)
          + " fails its CRC32C check");
    }
  }

  private void retry(IOException e) throws IOException, InterruptedException {
    closeConnection();
    boolean retriable = !(e instanceof KafkaConnection.KafkaErrorException)
        || ((KafkaConnection.KafkaErrorException) e).retriable();
    if (!retriable || ++failures > retries) {
      throw new IOException("raykafka source: reading " + piece + " at offset " + pos
          + " failed: " + e.getMessage(), e);
    }
    Thread.sleep(Math.min(1000L, 50L << Math.min(failures, 5)));
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

  private void closeConnection() {
    KafkaConnection c = conn;
    if (c != null) {
      c.close();
      conn = null;
    }
    inflight = -1;
  }
}
