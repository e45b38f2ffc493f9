"""flowtide."""
