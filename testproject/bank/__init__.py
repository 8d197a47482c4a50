"""A downstream bank, guarded by this package: the service the demo's payouts call over HTTP."""
