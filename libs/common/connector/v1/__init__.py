"""Generated from protos/connector/v1 (scripts/gen-protos.sh). Do not edit."""
