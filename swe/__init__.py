"""The SWE task model: what a row of a SWE dataset is, which image it runs in, how it is tested
and graded, which patches are refused as reward hacking, and the bundled task suites.

Between broker/ and envd/ in the layers (pyproject.toml [tool.importlinter]): envd imports swe
to run and grade what a row says; swe imports no envd. docs/tasks.md describes it."""
