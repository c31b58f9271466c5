"""confparse: `key = value` config files with sections."""

__version__ = "1.0.3"
