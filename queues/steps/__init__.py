"""The real work of the consumer daemons, free of ZooKeeper: manifests, downloads, minting,
storage, inventory, notification and access. Daemons call these; these never touch the queue."""
