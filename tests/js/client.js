// kafkajs (an independent, pure-JS Kafka client) driven by tests/test_kafka_clients_matrix.py.
//
// Reads one JSON request on stdin: {"brokers": ["host:port", ...], "op": NAME, ...op args};
// prints one JSON answer on stdout. kafkajs's own log lines go to stderr (errors only).
// Values, keys and timestamps are strings (UTF-8 values, decimal milliseconds).
//
// ops:
//   produce {topic, partition, idempotent, sends: [{acks, codec, values, timestamps}]}
//       one producer session; each send is one send() call with its acks and codec
//       ("none" or "gzip": what kafkajs has without extra codec packages).
//       -> {"sent": [[base offsets of each send's answer (-1 for acks 0)], ...]}
//   group {topic, group, count, timeout_ms}
//       a consumer in `group` subscribed to `topic` from the beginning (when the group has
//       no committed offset), reads until it has `count` records, commits what it read
//       (autoCommit off), disconnects.
//       -> {"records": [[partition, offset, value], ...]}
//   seek {topic, group, partition, offset, count, timeout_ms}
//       a consumer that seeks `partition` to `offset` and reads `count` records of it.
//       -> {"records": [[partition, offset, value], ...]}
//   offsets_for_times {topic, timestamp}
//       admin.fetchTopicOffsetsByTimestamp (ListOffsets with a timestamp).
//       -> {"offsets": {partition: offset}}
'use strict';

const { Kafka, CompressionTypes, logLevel } = require('kafkajs');

const CODECS = { none: CompressionTypes.None, gzip: CompressionTypes.GZIP };
// A consumer's fetch long-poll (kafkajs's default 5 s): disconnect() waits for the one in
// flight, so with the default every group or seek op ended with a 5 s wait once all its
// records were read.
const MAX_WAIT_MS = 250;

function stderrLogger() {
  return ({ label, log }) => {
    process.stderr.write(`kafkajs ${label} ${log.message} ${JSON.stringify(log)}\n`);
  };
}

function deadline(ms, what) {
  let timer;
  const promise = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms: ${what}`)), ms);
  });
  return { promise, cancel: () => clearTimeout(timer) };
}

async function produce(kafka, req) {
  const producer = kafka.producer({ idempotent: req.idempotent, allowAutoTopicCreation: false });
  await producer.connect();
  const sent = [];
  try {
    for (const s of req.sends) {
      if (!(s.codec in CODECS)) throw new Error(`kafkajs has no ${s.codec} codec built in`);
      const messages = s.values.map((value, i) => ({
        value, partition: req.partition, timestamp: s.timestamps[i],
      }));
      const answer = await producer.send({
        topic: req.topic, acks: s.acks, compression: CODECS[s.codec], messages,
      });
      sent.push(answer.map((r) => Number(r.baseOffset)));
    }
  } finally {
    await producer.disconnect();
  }
  return { sent };
}

// Runs `consumer` with eachMessage until `done(records)`; then commits what was read (if
// `commit`) and disconnects.
async function consumeUntil(consumer, req, { commit, done, onStart }) {
  const records = [];
  const next = new Map();       // partition -> offset after the last record read
  let finish;
  const finished = new Promise((resolve) => { finish = resolve; });
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ partition, message }) => {
      records.push([partition, Number(message.offset), message.value.toString()]);
      next.set(partition, Number(message.offset) + 1);
      if (done(records)) finish();
    },
  });
  if (onStart) onStart();
  const limit = deadline(req.timeout_ms, `${req.op} of ${req.topic} (${records.length} read)`);
  try {
    await Promise.race([finished, limit.promise]);
  } finally {
    limit.cancel();
  }
  await consumer.pause([{ topic: req.topic }]);
  if (commit) {
    await consumer.commitOffsets([...next].map(([partition, offset]) => ({
      topic: req.topic, partition, offset: String(offset),
    })));
  }
  await consumer.disconnect();
  return { records };
}

async function group(kafka, req) {
  const consumer = kafka.consumer({
    groupId: req.group, sessionTimeout: 10000, maxWaitTimeInMs: MAX_WAIT_MS,
  });
  await consumer.connect();
  await consumer.subscribe({ topic: req.topic, fromBeginning: true });
  return consumeUntil(consumer, req, { commit: true, done: (r) => r.length >= req.count });
}

async function seek(kafka, req) {
  const consumer = kafka.consumer({
    groupId: req.group, sessionTimeout: 10000, maxWaitTimeInMs: MAX_WAIT_MS,
  });
  await consumer.connect();
  // no committed offset and fromBeginning false: nothing is read before the seek, which
  // kafkajs allows once run() was called
  await consumer.subscribe({ topic: req.topic, fromBeginning: false });
  const wanted = (r) => r[0] === req.partition && r[1] >= req.offset;
  const out = await consumeUntil(consumer, req, {
    commit: false,
    done: (records) => records.filter(wanted).length >= req.count,
    onStart: () => consumer.seek({
      topic: req.topic, partition: req.partition, offset: String(req.offset),
    }),
  });
  return { records: out.records.filter((r) => r[0] === req.partition) };
}

async function offsetsForTimes(kafka, req) {
  const admin = kafka.admin();
  await admin.connect();
  try {
    const got = await admin.fetchTopicOffsetsByTimestamp(req.topic, Number(req.timestamp));
    const offsets = {};
    for (const p of got) offsets[p.partition] = Number(p.offset);
    return { offsets };
  } finally {
    await admin.disconnect();
  }
}

// admin {topic, partitions, replication_factor, config: {name: value}}
//     createTopics (waiting for leaders), describeConfigs of the topic, deleteTopics.
//     -> {"created": bool, "config": {name: value of the names asked}}
async function adminRound(kafka, req) {
  const admin = kafka.admin();
  await admin.connect();
  try {
    const created = await admin.createTopics({
      waitForLeaders: true, timeout: req.timeout_ms,
      topics: [{
        topic: req.topic, numPartitions: req.partitions,
        replicationFactor: req.replication_factor,
        configEntries: Object.entries(req.config).map(([name, value]) => ({ name, value })),
      }],
    });
    const described = await admin.describeConfigs({
      includeSynonyms: false,
      resources: [{ type: 2, name: req.topic, configNames: Object.keys(req.config) }],
    });
    const config = {};
    for (const e of described.resources[0].configEntries) config[e.configName] = e.configValue;
    await admin.deleteTopics({ topics: [req.topic], timeout: req.timeout_ms });
    return { created, config };
  } finally {
    await admin.disconnect();
  }
}

const OPS = { produce, group, seek, offsets_for_times: offsetsForTimes, admin: adminRound };

async function main() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const req = JSON.parse(Buffer.concat(chunks).toString());
  const kafka = new Kafka({
    clientId: 'raykafka-matrix', brokers: req.brokers, logLevel: logLevel.ERROR,
    logCreator: stderrLogger, retry: { retries: 5 },
  });
  const op = OPS[req.op];
  if (!op) throw new Error(`unknown op ${req.op}`);
  process.stdout.write(JSON.stringify(await op(kafka, req)) + '\n');
}

main().then(() => process.exit(0), (err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
