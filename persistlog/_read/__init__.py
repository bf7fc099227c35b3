"""Reading logs: listing and scanning, restore, positions, followers and named consumers."""
