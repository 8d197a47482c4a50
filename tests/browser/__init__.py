"""Tests that drive a real browser against a live server."""
