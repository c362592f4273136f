"""Maintenance jobs every service runs: retention of retired deliveries (ADR 009) and queue-table
upkeep, VACUUM / ANALYZE where autovacuum does not cover the tables (ADR 008)."""
