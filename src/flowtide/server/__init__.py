"""The distributed runtime's server side: coordinator (engine in PostgreSQL transactions),
outbox relay to NATS JetStream, and the HTTP API (FastAPI)."""
