"""Adapters to other libraries' models (optional extras)."""
