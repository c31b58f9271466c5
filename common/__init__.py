"""The floor every swarl package stands on: logging, settings, processes and services, the HTTP kit.

It imports no swarl component."""
