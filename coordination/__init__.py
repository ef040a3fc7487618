"""ZooKeeper through kazoo: znode layout, broker registry, controller election, replica
placement, and the embedded ZooKeeper launcher. Imports nothing else of raykafka's."""
