"""The materializer's domain, shared with the backfill command and the cutover: from a claimed
receipt and its route to an event and its WorkItems (docs/adr/004-materializer.md)."""
