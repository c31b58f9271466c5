"""The `swarl` subcommands, one module per component or operator task (mounted by swarl.cli)."""
