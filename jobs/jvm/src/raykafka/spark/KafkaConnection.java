package raykafka.spark;

import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;

/**
 * One PLAINTEXT connection to a broker's Kafka listener: Fetch v4 (the oldest Fetch raykafka
 * serves, non-flexible, record batches v2) and Metadata v1, with request header v1 and
 * response header v0 (actors/wire.py has the schemas). Not thread-safe: one per reader.
 */
final class KafkaConnection implements AutoCloseable {
  static final short FETCH = 1;
  static final short FETCH_VERSION = 4;
  static final short METADATA = 3;
  static final short METADATA_VERSION = 1;
  static final int CONNECT_TIMEOUT_MS = 10_000;
  static final int READ_TIMEOUT_MS = 60_000;
  static final int MAX_WAIT_MS = 500;

  private final Socket socket;
  private final DataOutputStream out;
  private final InputStream in;
  private final byte[] clientId;
  private final String address;
  private int correlation;
  private final java.util.ArrayDeque<Integer> pending = new java.util.ArrayDeque<>();
  private byte[] buf = new byte[1 << 16];

  KafkaConnection(String host, int port, String clientId) throws IOException {
    this.address = host + ":" + port;
    this.clientId = clientId.getBytes(StandardCharsets.UTF_8);
    Socket s = new Socket();
    try {
      s.setTcpNoDelay(true);
      s.connect(new InetSocketAddress(host, port), CONNECT_TIMEOUT_MS);
      s.setSoTimeout(READ_TIMEOUT_MS);
      this.out = new DataOutputStream(new BufferedOutputStream(s.getOutputStream(), 1024));
      this.in = s.getInputStream();
    } catch (IOException e) {
      s.close();
      throw new IOException("cannot connect to the broker at " + address + ": " + e, e);
    }
    this.socket = s;
  }

  /** A partition's answer to a Fetch: its records are buf[recordsOffset, +recordsLength). */
  static final class FetchAnswer {
    short errorCode;
    long highWatermark;
    byte[] buf;
    int recordsOffset;
    int recordsLength;
  }

  /** Kafka's error code as a retriable-or-not exception. */
  static final class KafkaErrorException extends IOException {
    private static final long serialVersionUID = 1L;
    final short code;

    KafkaErrorException(short code, String message) {
      super(message);
      this.code = code;
    }

    boolean retriable() {
      switch (code) {
        case 3: case 5: case 6: case 7: case 13: case 15: case 56: case 74: case 75:
          return true;
        default:
          return false;
      }
    }
  }

  static String errorName(short code) {
    switch (code) {
      case 1: return "OFFSET_OUT_OF_RANGE (records deleted by retention?)";
      case 2: return "CORRUPT_MESSAGE";
      case 3: return "UNKNOWN_TOPIC_OR_PARTITION";
      case 5: return "LEADER_NOT_AVAILABLE";
      case 6: return "NOT_LEADER_OR_FOLLOWER";
      case 7: return "REQUEST_TIMED_OUT";
      case 13: return "NETWORK_EXCEPTION";
      case 35: return "UNSUPPORTED_VERSION";
      case 56: return "KAFKA_STORAGE_ERROR";
      case 74: return "FENCED_LEADER_EPOCH";
      case 75: return "UNKNOWN_LEADER_EPOCH";
      default: return "code " + code;
    }
  }

  private void header(int bodySize, short apiKey, short version) throws IOException {
    int id = ++correlation;
    out.writeInt(2 + 2 + 4 + 2 + clientId.length + bodySize);
    out.writeShort(apiKey);
    out.writeShort(version);
    out.writeInt(id);
    out.writeShort(clientId.length);
    out.write(clientId);
    pending.addLast(id);
  }

  void sendFetch(String topic, int partition, long offset, int maxBytes) throws IOException {
    byte[] name = topic.getBytes(StandardCharsets.UTF_8);
    int body = 4 + 4 + 4 + 4 + 1 + 4 + 2 + name.length + 4 + 4 + 8 + 4;
    header(body, FETCH, FETCH_VERSION);
    out.writeInt(-1);                 // replica_id: a consumer
    out.writeInt(MAX_WAIT_MS);
    out.writeInt(1);                  // min_bytes
    out.writeInt(maxBytes);
    out.writeByte(0);                 // read_uncommitted, as read_topic
    out.writeInt(1);
    out.writeShort(name.length);
    out.write(name);
    out.writeInt(1);
    out.writeInt(partition);
    out.writeLong(offset);
    out.writeInt(maxBytes);
    out.flush();
  }

  /** The next response frame (after the correlation id) in buf, a new array when
   *  {@code fresh} (the caller keeps it); its length. */
  private int readFrame(boolean fresh) throws IOException {
    int size = readInt4();
    if (size < 4) throw new IOException(address + ": a response frame of " + size + " bytes");
    if (fresh) {
      buf = new byte[size];
    } else if (buf.length < size) {
      buf = new byte[Math.max(size, buf.length * 2)];
    }
    readFully(buf, 0, size);
    int id = PieceReader.getInt(buf, 0);
    Integer expected = pending.pollFirst();
    if (expected == null || expected != id) {
      throw new IOException(address + ": response for correlation id " + id + ", expected "
          + expected);
    }
    return size;
  }

  private final byte[] four = new byte[4];

  private int readInt4() throws IOException {
    readFully(four, 0, 4);
    return PieceReader.getInt(four, 0);
  }

  private void readFully(byte[] b, int off, int len) throws IOException {
    while (len > 0) {
      int n = in.read(b, off, len);
      if (n < 0) throw new EOFException(address + ": the broker closed the connection");
      off += n;
      len -= n;
    }
  }

  /** The answer to the oldest Fetch sent, for topic-partition (its only partition), in an
   *  array of its own when {@code fresh}. */
  FetchAnswer readFetch(String topic, int partition, boolean fresh) throws IOException {
    int size = readFrame(fresh);
    Cursor c = new Cursor(buf, 4, size);
    c.skip(4);                                         // throttle_time_ms
    int topics = c.i32();
    for (int t = 0; t < topics; t++) {
      String name = c.string();
      int partitions = c.i32();
      for (int i = 0; i < partitions; i++) {
        FetchAnswer a = new FetchAnswer();
        int index = c.i32();
        a.errorCode = c.i16();
        a.highWatermark = c.i64();
        c.skip(8);                                     // last_stable_offset
        int aborted = c.i32();
        if (aborted > 0) c.skip(16L * aborted);
        int length = c.i32();
        a.buf = buf;
        a.recordsOffset = c.p;
        a.recordsLength = Math.max(length, 0);
        c.skip(a.recordsLength);
        if (name.equals(topic) && index == partition) return a;
      }
    }
    throw new IOException(address + ": the Fetch response has no answer for " + topic + "-"
        + partition);
  }

  /** host:port of topic-partition's leader as the broker's metadata says, or null. */
  String leaderOf(String topic, int partition) throws IOException {
    byte[] name = topic.getBytes(StandardCharsets.UTF_8);
    header(4 + 2 + name.length, METADATA, METADATA_VERSION);
    out.writeInt(1);
    out.writeShort(name.length);
    out.write(name);
    out.flush();
    int size = readFrame(false);
    Cursor c = new Cursor(buf, 4, size);
    int brokers = c.i32();
    java.util.Map<Integer, String> addresses = new java.util.HashMap<>();
    for (int i = 0; i < brokers; i++) {
      int id = c.i32();
      String host = c.string();
      int port = c.i32();
      c.string();                                       // rack
      addresses.put(id, host + ":" + port);
    }
    c.skip(4);                                          // controller_id
    int topics = c.i32();
    for (int t = 0; t < topics; t++) {
      c.skip(2);
      String tn = c.string();
      c.skip(1);                                        // is_internal
      int partitions = c.i32();
      for (int i = 0; i < partitions; i++) {
        short error = c.i16();
        int index = c.i32();
        int leader = c.i32();
        c.skip(4L * c.i32());                           // replicas
        c.skip(4L * c.i32());                           // isr
        if (tn.equals(topic) && index == partition && error == 0 && leader >= 0) {
          return addresses.get(leader);
        }
      }
    }
    return null;
  }

  @Override
  public void close() {
    try {
      socket.close();
    } catch (IOException ignored) {
      // closing
    }
  }

  /** Big-endian reads within buf[p, limit). */
  static final class Cursor {
    final byte[] b;
    int p;
    final int limit;

    Cursor(byte[] b, int p, int limit) {
      this.b = b;
      this.p = p;
      this.limit = limit;
    }

    void need(long n) throws IOException {
      if (n < 0 || p + n > limit) throw new IOException("a truncated response");
    }

    void skip(long n) throws IOException {
      need(n);
      p += (int) n;
    }

    short i16() throws IOException {
      need(2);
      short v = (short) PieceReader.getShort(b, p);
      p += 2;
      return v;
    }

    int i32() throws IOException {
      need(4);
      int v = PieceReader.getInt(b, p);
      p += 4;
      return v;
    }

    long i64() throws IOException {
      need(8);
      long v = PieceReader.getLong(b, p);
      p += 8;
      return v;
    }

    String string() throws IOException {
      short n = i16();
      if (n < 0) return null;
      need(n);
      String s = new String(b, p, n, StandardCharsets.UTF_8);
      p += n;
      return s;
    }
  }
}
