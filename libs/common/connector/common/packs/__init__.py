"""Packs: the manifest model and its checks (``manifest``), the extraction language
(``extraction``, ``jsonvalues``), verification specs (``verification``), and the install of a
manifest as a generation with the active-route cache (``install``)."""
