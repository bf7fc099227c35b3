"""Writing a log: the Log and its parts, segments, syncs, rotation, retention, the writer lock, secondaries."""
