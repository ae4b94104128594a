"""Peer engines the benchmark harness compares durable with (Temporal, DBOS)."""
