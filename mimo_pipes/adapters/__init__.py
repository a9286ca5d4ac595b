"""Adapters that put the balance exchange behind loaders and iterators people already have."""
