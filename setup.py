"""Package discovery, the one thing pyproject.toml cannot say: every package under mimo_pipes/ is found, and
recipes/ (the files users copy and edit) installs beside them as mimo_pipes_recipes."""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["mimo_pipes", "mimo_pipes.*"]), "mimo_pipes_recipes"],
    package_dir={"mimo_pipes_recipes": "recipes"},
)
