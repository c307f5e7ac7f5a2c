"""envace: the reproducible experiment harness for the EnvACE paper."""

__version__ = "0.1.0"
