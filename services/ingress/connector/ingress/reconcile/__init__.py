"""Reconciliation against the sender's own record (docs/reconcile.md): ``provider`` speaks a route's
declared API, ``reconciler`` runs the passes (one leader across all ingress processes)."""
