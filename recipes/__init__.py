"""Recipes: each builds one module rank's graph; copy one to start your own."""
