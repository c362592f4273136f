"""The operator console (``connector console``, docs/console.md): a web client of the admin API."""
