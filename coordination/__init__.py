"""ZooKeeper through kazoo: znode layout, broker registry, controller election, replica
placement, and the embedded ZooKeeper launcher. Imports nothing else of raykafka's.

Modules (import them directly; nothing is re-exported here so that importing one does not
pull in the others):
  errors      typed coordination errors (the actors layer translates them)
  zk_layout   every znode path and JSON body (the only place that knows them)
  session     ZkSettings, connect() with the namespace chroot, ZkClient (timed kazoo calls)
  retry       RetryPolicy: explicit retryable errors, jittered backoff, attempts + deadline
  store       ZkStore: typed reads/writes of topics, partition state (conditional), configs,
              admin requests, consumer nodes, /cluster/id
  registry    BrokerRegistration: ephemeral /brokers/ids/<id>, re-created after expiry
  election    ControllerCandidate: /controller + /controller_epoch, SUSPENDED/LOST handling
  placement   assign_replicas_to_brokers (Kafka's AdminUtils, rack-aware)
  zk_server   EmbeddedZooKeeper: Debian's ZooKeeper on a loopback port
"""
