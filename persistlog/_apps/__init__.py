"""What apps build on a log: the resource store, the durable queue, sets of logs by key."""
