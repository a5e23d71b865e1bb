"""The model families and their contract."""
