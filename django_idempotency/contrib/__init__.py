"""Optional integrations, each importing its framework only when used."""
