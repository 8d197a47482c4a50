"""The demo's payments app."""
